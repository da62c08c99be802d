"""scripts/floor_table.py: docs/results.md §3.0's floor at a glance, printed from floor.csv."""
import pandas as pd

from tests.scripts import REPO, load_script

ft = load_script("floor_table")


def _floor(root, models=("markov", "pop", "sasrec", "gru4rec"), drop=None):
    rows = []
    for i, ds in enumerate(["ml-1m", "sports", "office"]):  # out of order, and one outside the main grid
        for j, stratum in enumerate(["overall", "Q0", "Q1", "cold", "warm"]):
            if (ds, stratum) == drop:
                continue
            row = {"dataset": ds, "tag": "", "stratum": stratum, "range": "", "users": 100}
            for k, m in enumerate(models):
                row[f"HR@10 {m}"] = f"0.{i}{j}{k}0"
                row[f"NDCG@10 {m}"] = "0.0001"
            row["best HR@10"] = models[-1]
            rows.append(row)
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(root / "floor.csv", index=False)
    return root


def test_every_model_of_floor_csv_gets_its_columns(tmp_path):
    lines = ft.table(_floor(tmp_path)).splitlines()
    assert lines[0] == ("| dataset | pop | markov | SASRec | GRU4Rec | Q0: markov | Q0: SASRec | Q0: GRU4Rec | "
                        "cold: markov | cold: best trained model |")
    assert [r.split(" | ")[0] for r in lines[2:]] == ["| Sports", "| ML-1M", "| Office"]
    # Sports is dataset 1; overall j=0, Q0 j=1, cold j=3; models markov 0, pop 1, sasrec 2, gru4rec 3
    assert lines[2] == ("| Sports | 0.1010 | 0.1000 | 0.1020 | 0.1030 | 0.1100 | 0.1120 | 0.1130 | 0.1300 | "
                        "0.1330 (GRU4Rec) |")


def test_bad_input_is_one_line(tmp_path, capsys):
    assert ft.main(["--tables", str(tmp_path)]) == 2
    assert "no " in capsys.readouterr().err
    _floor(tmp_path, drop=("sports", "Q0"))
    assert ft.main(["--tables", str(tmp_path)]) == 2
    assert "0 untagged Q0 rows for sports" in capsys.readouterr().err
    _floor(tmp_path, models=("pop", "sasrec"))
    assert ft.main(["--tables", str(tmp_path)]) == 2
    assert "needs markov" in capsys.readouterr().err


def test_the_docs_table_is_what_the_committed_floor_prints(monkeypatch):
    monkeypatch.chdir(REPO)
    printed = ft.table(REPO / "results" / "paper_main" / "tables").splitlines()
    docs = (REPO / "docs" / "results.md").read_text().splitlines()
    at = docs.index(printed[0])
    assert docs[at:at + len(printed)] == printed and len(printed) == 8


def test_best_counts_every_row_and_names_the_few(tmp_path):
    root = _floor(tmp_path)
    frame = pd.read_csv(root / "floor.csv", keep_default_na=False)
    frame.loc[frame.index[:2], "best HR@10"] = "markov"
    frame.loc[frame.index[2], "best HR@10"] = "–"
    frame.to_csv(root / "floor.csv", index=False)
    lines = ft.best_table(root).splitlines()
    assert lines[2] == "| GRU4Rec | 12 of 15 |  |"  # best in more than NAMED rows: not listed
    assert "| markov | 2 of 15 | ML-1M overall, ML-1M Q0 |" in lines and "| – (no hit) | 1 of 15 | ML-1M Q1 |" in lines
    assert ft.main(["--tables", str(root), "--best"]) == 0


def test_values_as_floor_csv_writes_them(tmp_path):
    """``–`` (no cell), a value with a note (other users: printed, never best), ties and no hit at all."""
    root = _floor(tmp_path)
    frame = pd.read_csv(root / "floor.csv", keep_default_na=False, dtype=str)
    sports_cold = (frame["dataset"] == "sports") & (frame["stratum"] == "cold")
    frame.loc[sports_cold, "HR@10 gru4rec"] = "–"  # GRU4Rec not run there yet
    frame.loc[sports_cold, "HR@10 sasrec"] = "0.5000 (1200 users)"
    ml_cold = (frame["dataset"] == "ml-1m") & (frame["stratum"] == "cold")
    frame.loc[ml_cold, ["HR@10 sasrec", "HR@10 gru4rec"]] = "0.2000"
    office_cold = (frame["dataset"] == "office") & (frame["stratum"] == "cold")
    frame.loc[office_cold, ["HR@10 sasrec", "HR@10 gru4rec"]] = "0.0000"
    frame.loc[frame.index[0], "best HR@10"] = "sasrec, gru4rec"
    frame.to_csv(root / "floor.csv", index=False)
    rows = {r.split(" | ")[0]: r for r in ft.table(root).splitlines()[2:]}
    assert rows["| Sports"].endswith("| – |")  # the only other-users value is not best, the other has none
    assert "| 0.5000 (1200 users) |" not in rows["| Sports"]  # cold values of trained models are not columns
    assert rows["| ML-1M"].endswith("| 0.2000 (SASRec, GRU4Rec) |") and rows["| Office"].endswith("| – |")
    best = ft.best_table(root).splitlines()
    assert any(line.startswith("| SASRec | 1 of 15 | ML-1M overall (tie)") for line in best)
    assert "| GRU4Rec | 15 of 15 |  |" in best  # a tie counts for each model in it
