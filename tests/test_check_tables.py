"""scripts/check_tables.py: the quoted bftrec-report commands are found, rerun, and a committed file that no
longer comes back from its command is named."""
import json

import pandas as pd

from tests.scripts import load_script

ct = load_script("check_tables")


def _run(root, seed, valid_hr, test_hr):
    """A run folder as bftrec-report valid-test reads it (history.csv and metrics.json)."""
    d = root / "ml-1m" / "hstu" / "standard" / f"seed{seed}"
    d.mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, len(valid_hr) + 1), "loss": 1.0, "valid_HR@10": valid_hr,
                  "valid_NDCG@10": [v / 2 for v in valid_hr]}).to_csv(d / "history.csv", index=False)
    (d / "metrics.json").write_text(json.dumps({
        "dataset": "ml-1m", "model": "hstu", "layer": "standard", "tag": None, "seed": seed, "best_epoch": 2,
        "test": {"overall": {"HR@10": test_hr, "NDCG@10": test_hr / 2}}}))


def test_a_committed_table_is_rechecked_and_a_changed_one_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "results" / "vt" / "runs", 0, [0.1, 0.3, 0.2], 0.25)
    _run(tmp_path / "results" / "vt" / "runs", 1, [0.2, 0.4], 0.29)
    from bftrec.report import cli
    assert cli.main(["valid-test", "results/vt/runs", "--out", "results/vt/valid_vs_test.md"]) == 0
    made = (tmp_path / "results" / "vt" / "valid_vs_test.md").read_text()
    cmd = "bftrec-report valid-test results/vt/runs --out results/vt/valid_vs_test.md"
    assert f"`{cmd}`" in made  # the table records its own command, which the checker reads
    (tmp_path / "README.md").write_text("Templates are not rerun: `bftrec-report tables --runs\n"
                                        "results/paper_<grid>/runs --out results/paper_<grid>/tables`.\n")
    assert ct.recorded_commands(tmp_path) == [
        "bftrec-report tables --runs results/paper_<grid>/runs --out results/paper_<grid>/tables", cmd]
    assert ct.main(["--json", "out.json"]) == 0
    outcome = json.loads((tmp_path / "out.json").read_text())
    assert outcome["counts"] == {"not rerunnable": 1, "same": 1}

    # a hand-edited number no longer comes from its command: named, exit 1, the committed file untouched
    edited = made.replace("0.2500", "0.2600")
    assert edited != made
    (tmp_path / "results" / "vt" / "valid_vs_test.md").write_text(edited)
    assert ct.main(["--only", "valid-test", "--json", "out.json"]) == 1
    res = json.loads((tmp_path / "out.json").read_text())["commands"]
    assert res == [{"command": cmd, "result": "differs", "files": ["results/vt/valid_vs_test.md"]}]
    assert (tmp_path / "results" / "vt" / "valid_vs_test.md").read_text() == edited

    # --write reruns it in place
    assert ct.main(["--only", "valid-test", "--write"]) == 0
    assert (tmp_path / "results" / "vt" / "valid_vs_test.md").read_text() == made


def test_a_command_that_fails_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "README.md").write_text(
        "`bftrec-report tables --runs results/x --out results/x/tables` (no runs there)\n")
    assert ct.main(["--json", "out.json"]) == 1
    assert json.loads((tmp_path / "out.json").read_text())["counts"] == {"failed": 1}


def test_a_printer_that_raises_fails_its_command_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "README.md").write_text(
        "Floor (`python scripts/floor_table.py --tables results/x`):\n\n| a |\n|---|\n")

    def broken(args):
        raise ValueError("could not convert string to float: '–'")

    monkeypatch.setattr(ct.PRINTERS["floor_table"], "render", broken)
    assert ct.main(["--json", "out.json"]) == 1
    (res,) = json.loads((tmp_path / "out.json").read_text())["commands"]
    assert res["result"] == "failed" and "the printer raised ValueError" in res["why"]


def test_parse_names_every_path_a_command_reads_whatever_the_flag_before_it():
    """A positional after a valued flag (``--from-epoch 76``) or after ``--allow-partial`` is still a path read;
    ``--runs`` takes several."""
    argv, out, reads = ct.parse("bftrec-report seconds --from-epoch 76 results/a/runs --out results/s.md")
    assert reads == ["results/a/runs"] and out is not None and str(out) == "results/s.md"
    _, _, reads = ct.parse("bftrec-report valid-test --allow-partial results/b --out results/v.md")
    assert reads == ["results/b"]
    _, _, reads = ct.parse("bftrec-report tables --runs r1 r2 --grid g.yaml --allow-partial --out results/t")
    assert reads == ["r1", "r2", "g.yaml"]
    _, _, reads = ct.parse("bftrec-report sweep --key dataset.inject_rate --comparisons c.csv --out results/w")
    assert reads == ["c.csv"]
    _, out, reads = ct.parse("bftrec-report seconds --from-epoch=76 results/a --runs=r1 --out=results/s/")
    assert reads == ["results/a", "r1"] and str(out) == "results/s"


def test_the_flag_lists_of_parse_match_the_report_modules():
    """MANY_VALUES and NO_VALUE are every flag of ``bftrec/report`` that takes other than one value: every
    ``nargs`` is ``"+"`` on a MANY_VALUES flag, every ``action`` but ``store`` and ``append`` a ``store_true`` on a
    NO_VALUE flag."""
    import ast
    from pathlib import Path
    nargs, actions = {}, {}
    for path in Path(ct.REPO, "bftrec", "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--")):
                continue
            for kw in node.keywords:
                if kw.arg in ("nargs", "action"):
                    ({"nargs": nargs, "action": actions}[kw.arg])[node.args[0].value] = ast.literal_eval(kw.value)
    valueless = {f: a for f, a in actions.items() if a not in ("store", "append")}  # those take one value each
    assert nargs == {f: "+" for f in ct.MANY_VALUES} and valueless == {f: "store_true" for f in ct.NO_VALUE}


def test_a_check_reruns_into_scratch_however_its_out_is_spelled(tmp_path, monkeypatch):
    """``--out results/t/`` and ``--out=results/t`` are the committed folder too: the rerun must write to scratch."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    seen = []
    monkeypatch.setattr(ct.cli, "main", lambda argv: seen.append(list(argv)) or 0)
    for spelling in ("--out results/t/", "--out=results/t", "--out results/t"):
        ct.check(f"bftrec-report tables --runs runs {spelling}", tmp_path / "scratch", write=False)
    scratch = str(tmp_path / "scratch" / "results" / "t")
    assert [a[a.index("--out") + 1] for a in seen] == [scratch] * 3
