"""scripts/cell_table.py: one Markdown row per finished cell, from metrics.json and the ledger; and
scripts/check_tables.py finds a quoted cell_table command whose rows no longer stand in its README."""
import json

import pytest

from tests.scripts import load_script

ctab = load_script("cell_table")
ct = load_script("check_tables")


def _cell(runs, cell, hr, best=3, run=9, sha="abcdef1234", ledger=("ran", 1234.5)):
    d = runs / cell
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({
        "best_epoch": best, "epochs_run": run, "valid": {"NDCG@10": hr / 3},
        "test": {"overall": {"HR@10": hr, "NDCG@10": hr / 2}}}))
    (d / "env.json").write_text(json.dumps({"git_sha": sha}))
    if ledger:
        status, wall = ledger
        with (runs / "ledger.jsonl").open("a") as f:
            f.write(json.dumps({"cell": cell, "status": status, "wall_s": wall, "git_sha": sha}) + "\n")


def test_rows_come_from_metrics_and_the_last_finished_ledger_line(tmp_path):
    runs = tmp_path / "runs"
    _cell(runs, "toys/sasrec/bft/seed0", 0.1, ledger=("resumed", 99.4), sha="1111111aaa")
    _cell(runs, "toys/sasrec/standard/seed10", 0.3, ledger=None)  # no line: env.json's commit, no wall
    _cell(runs, "toys/sasrec/standard/seed2", 0.2, best=5, run=15)
    with (runs / "ledger.jsonl").open("a") as f:  # a later failed line does not replace the finished one
        f.write(json.dumps({"cell": "toys/sasrec/standard/seed2", "status": "failed", "git_sha": "zzz"}) + "\n")
    (runs / "beauty/sasrec/bft/seed0").mkdir(parents=True)  # unfinished: no metrics.json, no row
    assert ctab.table(runs).splitlines() == [
        "| cell | commit | best epoch / run | valid NDCG@10 | test HR@10 | test NDCG@10 | wall s (ledger) |",
        "|---|---|---:|---:|---:|---:|---:|",
        "| toys/sasrec/standard/seed2 | `abcdef1` | 5 / 15 | 0.0667 | 0.2000 | 0.1000 | 1,234 |",
        "| toys/sasrec/standard/seed10 | `abcdef1` | 3 / 9 | 0.1000 | 0.3000 | 0.1500 | – |",
        "| toys/sasrec/bft/seed0 | `1111111` (resumed) | 3 / 9 | 0.0333 | 0.1000 | 0.0500 | 99 |"]
    assert len(ctab.table(runs, ["*/bft/*"]).splitlines()) == 3


def test_a_folder_without_a_ledger_gets_no_wall_column(tmp_path):
    _cell(tmp_path / "runs", "sports/hstu/standard/seed0", 0.05, ledger=None)
    header, _, row = ctab.table(tmp_path / "runs").splitlines()
    assert "wall" not in header
    assert row == "| sports/hstu/standard/seed0 | `abcdef1` | 3 / 9 | 0.0167 | 0.0500 | 0.0250 |"


def test_bad_input_is_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    _cell(runs, "toys/sasrec/bft/seed0", 0.1)
    assert ctab.main(["--runs", str(runs), "--only", "toys/sasrec"]) == 2  # no '*': matches no cell
    assert "--only 'toys/sasrec' matches no finished cell" in capsys.readouterr().err
    assert ctab.main(["--runs", str(tmp_path / "nope")]) == 2
    assert "no runs folder" in capsys.readouterr().err
    (runs / "toys/sasrec/bft/seed0/metrics.json").write_text('{"best_epoch": 3}')
    with pytest.raises(SystemExit, match="lacks 'epochs_run'"):
        ctab.table(runs)


def test_check_tables_names_a_quoted_cell_table_whose_rows_moved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "results" / "g" / "runs"
    _cell(runs, "toys/sasrec/standard/seed0", 0.1)
    _cell(runs, "toys/sasrec/bft/seed0", 0.2)
    cmd = "python scripts/cell_table.py --runs results/g/runs --only 'toys/*'"
    readme = tmp_path / "results" / "g" / "README.md"
    made = ctab.table(runs.relative_to(tmp_path), ["toys/*"])
    readme.write_text(f"Per cell (`{cmd}`):\n\n{made}\n\nand a missing folder: "
                      "`python scripts/cell_table.py --runs results/gone/runs`\n")
    assert ct.recorded_cell_tables(tmp_path) == [
        (readme, cmd), (readme, "python scripts/cell_table.py --runs results/gone/runs")]
    assert ct.main(["--json", "out.json"]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["counts"] == {"not rerunnable": 1, "same": 1}

    readme.write_text(readme.read_text().replace("0.2000", "0.2100"))  # a hand-edited number
    assert ct.main(["--only", "toys", "--json", "out.json"]) == 1
    (res,) = json.loads((tmp_path / "out.json").read_text())["commands"]
    assert res["result"] == "differs" and res["files"] == ["toys/sasrec/bft/seed0"]
