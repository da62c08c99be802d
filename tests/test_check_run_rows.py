"""scripts/check_run_rows.py: the hand-written run rows of the results READMEs against their runs' metrics.json."""
import json

from tests.scripts import load_script

rr = load_script("check_run_rows")
ct = load_script("check_tables")

METRICS = {"best_epoch": 32, "epochs_run": 42, "valid": {"NDCG@10": 0.07041, "HR@10": 0.1}, "test": {"overall": {
    "HR@10": 0.09466, "NDCG@10": 0.05694, "MRR": 0.04}}}
HEAD = "| windows | valid NDCG@10 | test HR@10 | test NDCG@10 | best epoch / run |\n|---|---|---|---|---|\n"


def _study(tmp_path, rows, metrics=METRICS):
    study = tmp_path / "results" / "study"
    (study / "runs" / "a").mkdir(parents=True)
    (study / "runs" / "a" / "metrics.json").write_text(json.dumps(metrics))
    readme = study / "README.md"
    readme.write_text("Two runs:\n\n" + HEAD + "".join(r + "\n" for r in rows) + "\nAfter.\n")
    return readme


def test_a_row_naming_a_run_is_compared_at_its_printed_precision(tmp_path):
    readme = _study(tmp_path, ["| `prefixes` (`runs/a/`) | **0.0704 (+14.1%)** | 0.095 (p 0.14) | **0.0569** "
                               "| 32 / 42 |",
                               "| `last`, 3 seeds | 0.0617 ± 0.0010 | 0.0817 | 0.0495 | 20 / 30 |"])
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "same" and "(1 of 2 checked)" in res["command"]


def test_a_stale_number_or_epoch_differs(tmp_path):
    readme = _study(tmp_path, ["| `prefixes` (`runs/a/`) | 0.0705 | 0.0947 | 0.0569 | 31 / 42 |"])
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "differs"
    (row,) = res["files"]
    assert "valid NDCG@10: 0.0705, run 0.0704" in row and "best epoch / run: 31 / 42, run 32 / 42" in row
    assert "test HR@10" not in row


def test_means_and_rows_without_a_run_are_not_compared(tmp_path):
    readme = _study(tmp_path, ["| `runs/a/` | 0.0999 ± 0.0010 | n/a | – | 40 ± 2 |",  # a run named, nothing to compare
                               "| `elsewhere/` | 0.5 | 0.5 | 0.5 | 1 / 2 |",
                               "| `runs/a/` (\\| an escaped pipe) | +0.0704 | ≈0.0947 | 0.0569 | 32 / 42 |"])
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "same" and "(1 of 3 checked)" in res["command"]


def test_coarse_numbers_and_numbers_the_run_lacks_differ(tmp_path):
    readme = _study(tmp_path, ["| `runs/a/` | 0.07 | 0.1 | 0.0569 | 32 / 42 |"])
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "differs"
    assert "valid NDCG@10: 0.07, printed with 2 decimals" in res["files"][0] and "test HR@10: 0.1," in res["files"][0]
    readme = _study(tmp_path / "b", ["| `runs/a/` | 0.0704 | 0.0947 | 0.0569 | 32 / 42 |"],
                    metrics={"valid": {"NDCG@10": "0.0704"}, "test": []})
    (res,) = rr.check_markdown(readme, tmp_path / "b")
    assert res["result"] == "differs" and res["files"][0].count("the run has no") == 4


def test_an_unreadable_metrics_file_fails(tmp_path):
    readme = _study(tmp_path, ["| `runs/a/` | 0.0704 | 0.0947 | 0.0569 | 32 / 42 |"])
    for text in ("{", "[]"):
        (tmp_path / "results" / "study" / "runs" / "a" / "metrics.json").write_text(text)
        (res,) = rr.check_markdown(readme, tmp_path)
        assert res["result"] == "failed" and "metrics.json" in res["why"]


def test_check_tables_reports_run_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _study(tmp_path, ["| `runs/a/` | 0.0704 | 0.0947 | 0.0569 | 32 / 42 |"])
    assert ct.main(["--json", "out.json"]) == 0 and rr.main([]) == 0
    _study(tmp_path / "b", ["| `runs/a/` | 0.0704 | 0.0948 | 0.0569 | 32 / 42 |"])  # a stale hand edit
    monkeypatch.chdir(tmp_path / "b")
    assert ct.main(["--json", "out.json"]) == 1 and rr.main([]) == 1
    (res,) = json.loads((tmp_path / "b" / "out.json").read_text())["commands"]
    assert res["result"] == "differs" and "test HR@10: 0.0948, run 0.0947" in res["files"][0]


def test_the_committed_readmes_hold_their_runs_numbers():
    from tests.scripts import REPO

    outcomes = rr.check_all(REPO)
    assert len(outcomes) >= 5 and all(o["result"] == "same" for o in outcomes), outcomes


def test_means_are_checked_against_the_tables_cited_above(tmp_path):
    study = tmp_path / "results" / "m"
    (study / "tables").mkdir(parents=True)
    (study / "tables" / "variants.md").write_text("| tag | valid NDCG@10 |\n|---|---|\n| a | 0.7407 ± 0.0190 |\n")
    readme = study / "README.md"
    table = "| arm | valid NDCG@10 | best epoch |\n|---|---|---|\n| `a` | **0.741 ± 0.019** (+2%) | 27 ± 15 |\n"
    readme.write_text("## Arms\n\nTable: `tables/variants.md`.\n\n" + table)
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "differs" and res["files"] == ["27 ± 15"]  # the epoch is not in the cited table
    readme.write_text("## Arms\n\nTable: `tables/`.\n\n" + table.replace(" | 27 ± 15 |", " | 27 |"))
    (res,) = rr.check_markdown(readme, tmp_path)  # a folder: every table in it
    assert res["result"] == "same" and "(1, against variants.md)" in res["command"]
    readme.write_text("## Arms\n\nTable: `tables/variants.md`.\n\n" + table.replace("0.741", "0.742"))
    (res,) = rr.check_markdown(readme, tmp_path)
    assert res["result"] == "differs" and "0.742 ± 0.019" in res["files"]
    readme.write_text("## Arms\n\nNo table cited.\n\n" + table)
    assert rr.check_markdown(readme, tmp_path) == []


def test_intervals_printed_tables_and_generated_files(tmp_path):
    study = tmp_path / "results" / "s"
    (study / "sweep").mkdir(parents=True)
    (study / "sweep" / "sweep.md").write_text("- Made by `bftrec-report sweep ...`.\n\n| gain | 95% CI |\n|---|---|\n"
                                              "| -3.1% | [-8.9%, +2.7%] |\n| +0.3% | [-2.1%, +2.7%] |\n")
    readme = study / "README.md"
    table = "| HR@10 | r = 0 |\n|---|---|\n| overall | −3.1% [−8.9%, +2.7%], p_Holm 0.57 |\n"
    readme.write_text("From `sweep/sweep.md`:\n\n" + table)
    outcomes = rr.check_all(tmp_path)  # sweep.md itself is generated: its command is rechecked, not its text
    assert [o["result"] for o in outcomes] == ["same"] and "(1, against sweep.md)" in outcomes[0]["command"]
    readme.write_text("From `sweep/sweep.md`:\n\n" + table.replace("−8.9%", "−8.8%"))
    (res,) = rr.check_all(tmp_path)
    assert res["result"] == "differs" and res["files"] == ["[−8.8%, +2.7%]"]
    readme.write_text("From `sweep/sweep.md`, printed by `python scripts/floor_table.py --tables x`:\n\n" + table)
    assert rr.check_all(tmp_path) == []  # a printed table: check_tables compares it with its printer


def test_the_reviewers_false_passes_now_differ(tmp_path):
    """Signs, a number's tail (9,214), coarse means, en-dash intervals; a README never vouches for itself; a
    root-relative citation counts; any quoted script other than a printer does not switch the check off."""
    study = tmp_path / "results" / "n"
    (study / "tables").mkdir(parents=True)
    (study / "tables" / "variants.md").write_text(
        "| a | 0.0882 ± 0.0070 | 214 ± 54 | 0.0745 ± 0.0125 | [-8.9%, +2.7%] |\n")
    readme = study / "README.md"

    def outcome(cells: str, cite: str = "`tables/variants.md`") -> dict:
        readme.write_text(f"From {cite} (`python scripts/check_tables.py --only x`):\n\n| arm | v |\n|---|---|\n"
                          f"| `x` | {cells} |\n")
        (res,) = rr.check_all(tmp_path)
        return res

    assert outcome("0.0882 ± 0.0070, 214 ± 54, 0.075 ± 0.013, −8.9% [−8.9%, +2.7%]")["result"] == "same"
    assert outcome("0.074 ± 0.012")["result"] == "same"  # either rounding of a half
    for wrong in ("−0.0882 ± 0.0070", "9,214 ± 54", "0.1 ± 0.0", "[–9.9%, +2.7%]", "[−8.9 %, +2.8 %]"):
        assert outcome(wrong)["result"] == "differs", wrong
    assert outcome("0.0882 ± 0.0070", "`results/n/tables/variants.md`")["result"] == "same"  # from the root
    readme_cells = "0.5555 ± 0.0001"
    res = outcome(readme_cells, "`tables/variants.md` and `./`")  # the README itself is no source
    assert res["result"] == "differs" and res["files"] == ["0.5555 ± 0.0001"]


def test_every_printer_named_is_a_script_check_tables_can_run():
    """One list of printers (check_run_rows.PRINTERS) serves both checks; each is a script with the interface
    check_tables calls."""
    for name, module in ct.PRINTERS.items():
        assert (ct.REPO / "scripts" / f"{name}.py").is_file()
        assert all(callable(getattr(module, f)) for f in ("parser", "render", "inputs", "main"))
        assert isinstance(module.KEY_CELLS, int) and module.KEY_CELLS >= 1
