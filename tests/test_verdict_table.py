"""scripts/verdict_table.py: the README's verdict on the paper, printed from the committed tables; a verdict whose
rule the numbers no longer meet reads "to restate", so that check_tables fails until a person rereads it."""
import shutil

import pandas as pd

from tests.scripts import REPO, load_script

vt = load_script("verdict_table")
ct = load_script("check_tables")

FOLDERS = {"main": "results/paper_main/tables", "snr": "results/snr",
           "replication": "results/paper_main/replication",
           "equal-budget": "results/equal_budget/office_sasrec/tables"}


def _argv():
    """The README's arguments: relative paths, as the table prints them (run from the folder that holds them)."""
    return [a for key, rel in FOLDERS.items() for a in (f"--{key}", rel)]


def _render(root, monkeypatch):
    monkeypatch.chdir(root)
    return vt.render(vt.parser().parse_args(_argv()))


def _copy(tmp_path):
    """The committed csv files the table reads (and the replication's run count, as empty metrics.json files)."""
    for rel in FOLDERS.values():
        for src in (REPO / rel).rglob("*.csv"):
            if "runs" not in src.relative_to(REPO / rel).parts:
                dst = tmp_path / src.relative_to(REPO)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dst)
    for src in (REPO / FOLDERS["replication"] / "runs").glob("sports/hstu/*/seed*/metrics.json"):
        dst = tmp_path / src.relative_to(REPO)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text("{}")
    return tmp_path


def _rows(text):
    return {r.split(" | ")[0].lstrip("| "): r.split(" | ")[-1].rstrip(" |") for r in text.splitlines()[2:]}


def test_the_readme_table_is_what_the_committed_tables_print(monkeypatch):
    printed = _render(REPO, monkeypatch).splitlines()
    readme = (REPO / "README.md").read_text().splitlines()
    at = readme.index(printed[0])
    assert readme[at:at + len(printed)] == printed
    assert len(printed) == 10 and not any("to restate" in r for r in printed)


def test_a_verdict_whose_rule_no_longer_holds_says_so(tmp_path, monkeypatch):
    root = _copy(tmp_path)
    before = _rows(_render(root, monkeypatch))
    meta_path = root / FOLDERS["main"] / "meta.csv"
    meta = pd.read_csv(meta_path)
    overall = (meta["layer"] == "bft") & meta["tag"].isna() & (meta["endpoint"] == "HR@10 overall") \
        & (meta["backbones"] == "all")
    meta.loc[overall, ["gain", "p"]] = [0.05, 0.001]  # a pooled gain the claim would stand on
    meta.to_csv(meta_path, index=False)
    next(iter((root / FOLDERS["replication"] / "runs").glob("sports/hstu/bft_h/seed3/metrics.json"))).unlink()
    after = _rows(_render(root, monkeypatch))
    claim = "BFT gains on all three backbones and six datasets"
    ablation = "(our ablation) v1 units, Sports HSTU, cold users"
    assert before[claim] == "not reproduced"
    assert after[claim] == "to restate: pooled p ≥ 0.05 and no pair passing Holm no longer holds"
    assert after[ablation].startswith("to restate:")
    assert {k: v for k, v in after.items() if k not in (claim, ablation)} == \
        {k: v for k, v in before.items() if k not in (claim, ablation)}


def test_the_k_rule_reads_the_mechanism_table(tmp_path, monkeypatch):
    root = _copy(tmp_path)
    path = root / FOLDERS["main"] / "mechanism.csv"
    mech = pd.read_csv(path)
    q0 = (mech["grouping"] == "history tokens") & (mech["stratum"] == "Q0") & (mech["dataset"] == "sports") \
        & (mech["model"] == "hstu")
    mech.loc[q0, "K bft"] = "0.9000 ± 0.0100"  # far above Q4 (0.625): a pattern across frequency
    mech.to_csv(path, index=False)
    row = [r for r in _render(root, monkeypatch).splitlines() if r.startswith("| K ≈")][0]
    assert "0.60–0.90" in row and "at most 0.275" in row and "to restate" in row


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    (root / FOLDERS["snr"] / "sweep" / "trend.csv").unlink()
    assert vt.main(_argv()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no " in err and "trend.csv" in err
    root = _copy(tmp_path / "again")
    monkeypatch.chdir(root)
    path = root / FOLDERS["replication"] / "tables_bft_seeds3-7" / "beyond_tests.csv"
    tests = pd.read_csv(path)
    tests["Δ tail_share@10 (95% CI, p_seeds)"] = "smaller"
    tests.to_csv(path, index=False)
    assert vt.main(_argv()) == 2
    assert "'smaller'" in capsys.readouterr().err


def test_check_tables_reruns_it(tmp_path, monkeypatch):
    root = _copy(tmp_path)
    cmd = "python scripts/verdict_table.py " + " ".join(_argv())
    table = _render(root, monkeypatch)
    readme = root / "README.md"
    readme.write_text(f"The verdict (`{cmd}`):\n\n{table}\n")
    assert ct.main(["--only", "verdict_table", "--json", "out.json"]) == 0
    readme.write_text(f"The verdict (`{cmd}`):\n\n{table.replace('Holm 0.12)', 'Holm 0.13)')}\n")  # a hand edit
    assert ct.main(["--only", "verdict_table", "--json", "out.json"]) == 1


def test_pooled_rows_are_the_docs_table_and_refuse_other_folders(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    printed = vt.render(vt.parser().parse_args(["--main", FOLDERS["main"], "--pooled"])).splitlines()
    docs = (REPO / "docs" / "results.md").read_text().splitlines()
    at = docs.index(printed[0])
    assert docs[at:at + len(printed)] == printed and len(printed) == 2 + len(vt.POOLED)
    assert "| Q0 (rarest items), all backbones | 11 of 18 |" in printed[6]  # pairs left out for too few hits
    assert vt.main(["--main", FOLDERS["main"], "--pooled", "--snr", FOLDERS["snr"]]) == 2
    assert "--pooled reads --main only; drop --snr" in capsys.readouterr().err
    assert vt.main(["--main", FOLDERS["main"]]) == 2
    assert "give --snr, --replication, --equal-budget" in capsys.readouterr().err
