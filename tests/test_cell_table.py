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
    dataset, model, layer = cell.split("/")[:3]
    (d / "metrics.json").write_text(json.dumps({
        "dataset": dataset, "model": model, "layer": layer, "best_epoch": best, "epochs_run": run,
        "valid": {"NDCG@10": hr / 3},
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


def test_a_cell_run_from_a_dirty_tree_says_so(tmp_path):
    """``git_dirty`` of the ledger line (else of env.json) marks the commit: it is not all of the code that ran."""
    runs = tmp_path / "runs"
    _cell(runs, "yelp/gru4rec/standard/seed0", 0.1, ledger=("ran", 10.0))
    _cell(runs, "yelp/gru4rec/standard/seed1", 0.1, ledger=("resumed", 10.0))
    lines = (runs / "ledger.jsonl").read_text().splitlines()
    (runs / "ledger.jsonl").write_text("".join(json.dumps({**json.loads(x), "git_dirty": True}) + "\n" for x in lines))
    _cell(runs, "yelp/gru4rec/standard/seed2", 0.1, ledger=None)
    (runs / "yelp/gru4rec/standard/seed2/env.json").write_text(json.dumps({"git_sha": "abcdef1234", "git_dirty": True}))
    _cell(runs, "yelp/gru4rec/standard/seed3", 0.1)  # git_dirty absent: no mark
    commits = [r.split(" | ")[1] for r in ctab.table(runs).splitlines()[2:]]
    assert commits == ["`abcdef1` (dirty)", "`abcdef1` (resumed, dirty)", "`abcdef1` (dirty)", "`abcdef1`"]


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
    for wrong in (runs / "toys/sasrec", runs / "toys/sasrec/bft", tmp_path):  # a level too deep or too shallow
        with pytest.raises(SystemExit, match="not dataset/model/layer/|a level too deep or too shallow"):
            ctab.table(wrong)
    metrics = runs / "toys/sasrec/bft/seed0/metrics.json"
    good = metrics.read_text()
    for text, match in (('{"best_epoch": 3}', "lacks 'epochs_run'"), ("[1, 2]", "lacks"),
                        (good.replace('"HR@10": 0.1', '"HR@10": null'), "test HR@10 is None"),
                        (good.replace('"HR@10": 0.1', '"HR@10": "0.1"'), "test HR@10 is '0.1'"),
                        ('{"best', "not readable JSON")):
        metrics.write_text(text)
        with pytest.raises(SystemExit, match=match):
            ctab.table(runs)
    metrics.write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit, match="not readable JSON"):
        ctab.table(runs)
    metrics.write_text(good)
    (runs / "toys/sasrec/bft/seed0/env.json").write_text("{torn")
    with pytest.raises(SystemExit, match="env.json is not readable JSON"):
        ctab.table(runs)


def test_odd_ledgers_give_the_right_row_or_one_line(tmp_path):
    runs = tmp_path / "runs"
    _cell(runs, "toys/sasrec/bft/seed0", 0.1, ledger=None)
    with (runs / "ledger.jsonl").open("a") as f:  # a trailing slash, a bool and a NaN wall time, no git_sha
        f.write(json.dumps({"cell": "toys/sasrec/bft/seed0/", "status": "ran", "wall_s": True}) + "\n")
    assert ctab.table(runs).splitlines()[-1].endswith("| `abcdef1` | 3 / 9 | 0.0333 | 0.1000 | 0.0500 | – |")
    (runs / "ledger.jsonl").write_text(json.dumps(
        {"cell": "toys/sasrec/bft/seed0", "status": "ran", "wall_s": float("nan"), "git_sha": None}) + "\n")
    assert ctab.table(runs).splitlines()[-1].endswith("| `abcdef1` | 3 / 9 | 0.0333 | 0.1000 | 0.0500 | – |")
    (runs / "toys/sasrec/bft/seed0.bak").mkdir()  # a copy beside a cell is not a cell
    (runs / "toys/sasrec/bft/seed0.bak/metrics.json").write_text("{}")
    assert len(ctab.table(runs).splitlines()) == 3
    (runs / "ledger.jsonl").write_text(json.dumps(  # the folder was replaced after its line: refused
        {"cell": "toys/sasrec/bft/seed0", "status": "ran", "wall_s": 5, "git_sha": "9999999abc"}) + "\n")
    with pytest.raises(SystemExit, match="ran at 9999999, its env.json at abcdef1"):
        ctab.table(runs)


def _readme(tmp_path, body):
    readme = tmp_path / "results" / "g" / "README.md"
    readme.write_text(body)
    return readme


def test_check_tables_names_a_quoted_cell_table_whose_rows_moved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "results" / "g" / "runs"
    _cell(runs, "toys/sasrec/standard/seed0", 0.1)
    _cell(runs, "toys/sasrec/bft/seed0", 0.2)
    cmd = "python scripts/cell_table.py --runs results/g/runs --only 'toys/*'"
    made = ctab.table(runs.relative_to(tmp_path), ["toys/*"])
    readme = _readme(tmp_path, f"Per cell (`{cmd.replace(' --only', chr(10) + '--only')}`):\n\n{made}\n\nText.\n")
    assert ct.recorded_quoted_tables(tmp_path) == [(readme, cmd, made.splitlines())]  # a line break reads as a space
    assert ct.main(["--json", "out.json"]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["counts"] == {"same": 1}

    def outcome(body):
        _readme(tmp_path, body)
        status = ct.main(["--only", "cell_table", "--json", "out.json"])
        (res,) = json.loads((tmp_path / "out.json").read_text())["commands"]
        return status, res["result"], res.get("files") or res.get("why")

    assert outcome(f"`{cmd}`\n\n{made.replace('0.2000', '0.2100')}\n") == (1, "differs", ["toys/sasrec/bft/seed0"])
    stale = "| toys/sasrec/bft/seed9 | `abcdef1` | 3 / 9 | 0.1 | 0.1 | 0.1 | 1 |"
    assert outcome(f"`{cmd}`\n\n{made}\n{stale}\n") == (1, "differs", ["toys/sasrec/bft/seed9"])  # a left-over row
    narrow = "python scripts/cell_table.py --runs results/g/runs --only 'toys/sasrec/standard/*'"
    assert outcome(f"`{narrow}`\n\n{made}\n") == (1, "differs", ["toys/sasrec/bft/seed0"])  # a row outside --only
    no_table = ("failed", "no table right after the paragraph quoting the command")
    assert outcome(f"`{cmd}`\n\n## Next\n\n{made}\n")[1:] == no_table
    assert outcome(f"`{cmd}`\n\nA paragraph between.\n\n{made}\n")[1:] == no_table
    assert outcome(f"`{cmd}`, and the paragraph\ngoes on.\n\n{made}\n")[1] == "same"
    assert outcome("`python scripts/cell_table.py --runs results/gone/runs`\n\n| x |\n")[1] == "failed"
    assert outcome("`python scripts/cell_table.py --runs results/g/runs --only 'toys/*`\n\n| x |\n")[1] == "failed"
    status, result, why = outcome(f"```\npython3 scripts/cell_table.py --runs results/g/runs\n```\n\n{made}\n")
    assert (status, result) == (1, "failed") and "cannot be checked" in why


def test_write_puts_the_printed_rows_below_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "results" / "g" / "runs"
    _cell(runs, "toys/sasrec/standard/seed0", 0.1)
    cmd = "python scripts/cell_table.py --runs results/g/runs"
    old = ctab.table(runs.relative_to(tmp_path))
    _cell(runs, "toys/sasrec/standard/seed1", 0.2)  # a cell collected since
    readme = _readme(tmp_path, f"Intro.\n\nPer cell (`{cmd}`):\n\n{old}\n\nAfter.\n")
    assert ct.main(["--only", "cell_table"]) == 1
    assert ct.main(["--only", "cell_table", "--write"]) == 0
    new = ctab.table(runs.relative_to(tmp_path))
    assert readme.read_text() == f"Intro.\n\nPer cell (`{cmd}`):\n\n{new}\n\nAfter.\n"
    assert ct.main(["--only", "cell_table"]) == 0
