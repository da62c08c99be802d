"""scripts/collect_cells.py: finished cells move to the committed folder without checkpoints, once."""
import json
import subprocess

import pytest

from tests.scripts import load_script

cc = load_script("collect_cells")


def _cell(src, cell, status, written, hr=0.05, finished=True):
    d = src / cell
    d.mkdir(parents=True)
    (d / "last.pt").write_bytes(b"\0" * 16)
    (d / ".lock").write_text("")
    (d / "train.log").write_text("log\n")
    if finished:
        (d / "metrics.json").write_text(json.dumps(
            {"test": {"overall": {"HR@10": hr}}, "best_epoch": 3, "epochs_run": 9}))
    rec = {"cell": cell, "status": status, "written": written, "wall_s": 1234.4, "git_sha": "abcdef1234"}
    with (src / "ledger.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n\n")


def test_collects_finished_cells_once_without_checkpoints(tmp_path):
    src, dst = tmp_path / "pm" / "runs", tmp_path / "results" / "runs"
    src.mkdir(parents=True)
    _cell(src, "sports/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00")
    _cell(src, "sports/sasrec/standard/seed0", "failed", "2026-12-04T01:05:00", finished=False)
    _cell(src, "sports/hstu/bft/seed1", "resumed", "2026-12-04T02:00:00")
    _cell(src, "ml-100k/sasrec/bft/rate0.1/seed2", "ran", "2026-12-04T03:00:00")  # a sweep's variant folder
    assert cc.collect(src, dst) == ["sports/sasrec/bft/seed0", "sports/hstu/bft/seed1",
                                    "ml-100k/sasrec/bft/rate0.1/seed2"]
    assert (dst / "ml-100k/sasrec/bft/rate0.1/seed2/metrics.json").exists()
    got = dst / "sports/sasrec/bft/seed0"
    assert (got / "metrics.json").exists() and (got / "train.log").exists()
    assert not (got / "last.pt").exists() and not (got / ".lock").exists()
    assert not (dst / "sports/sasrec/standard/seed0").exists()
    lines = (dst / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(x)["cell"] for x in lines] == ["sports/sasrec/bft/seed0", "sports/hstu/bft/seed1",
                                                      "ml-100k/sasrec/bft/rate0.1/seed2"]
    assert cc.collect(src, dst) == []  # a second pass finds nothing new
    assert len((dst / "ledger.jsonl").read_text().splitlines()) == 3


def test_only_collects_the_matching_cells_and_leaves_the_rest_pending(tmp_path):
    src, dst = tmp_path / "pm" / "runs", tmp_path / "results" / "runs"
    src.mkdir(parents=True)
    _cell(src, "beauty/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00")
    _cell(src, "beauty/gru4rec/standard/seed0", "ran", "2026-12-04T01:05:00")
    _cell(src, "toys/sasrec/standard/seed1", "ran", "2026-12-04T01:10:00")
    assert cc.collect(src, dst, only=("beauty/sasrec/*", "toys/sasrec/*")) == [
        "beauty/sasrec/bft/seed0", "toys/sasrec/standard/seed1"]
    assert not (dst / "beauty/gru4rec").exists()
    assert cc.collect(src, dst) == ["beauty/gru4rec/standard/seed0"]  # still pending, collected later
    cc.main(["--src", str(src), "--dst", str(tmp_path / "d2"), "--only", "*/gru4rec/*"])
    assert [json.loads(x)["cell"] for x in (tmp_path / "d2" / "ledger.jsonl").read_text().splitlines()] == [
        "beauty/gru4rec/standard/seed0"]
    with pytest.raises(SystemExit, match=r"--only 'beauty/sasrec' matches no finished cell in .*ledger.jsonl; a "
                                         r"pattern matches the whole cell path, e.g. 'beauty/sasrec/\*'"):
        cc.collect(src, tmp_path / "d3", only=("beauty/sasrec",))  # a typo, not "nothing new"
    assert not (tmp_path / "d3").exists()


def test_never_overwrites_different_results(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _cell(src, "toys/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00", hr=0.07)
    old = dst / "toys/sasrec/bft/seed0"
    old.mkdir(parents=True)
    (old / "metrics.json").write_text('{"test": "older run"}')
    with pytest.raises(SystemExit, match="different metrics.json.*--replace"):
        cc.collect(src, dst)
    assert (old / "metrics.json").read_text() == '{"test": "older run"}'
    assert cc.main(["--src", str(src), "--dst", str(dst)]) == 2
    assert cc.collect(src, dst, replace=True) == ["toys/sasrec/bft/seed0"]
    assert json.loads((old / "metrics.json").read_text())["test"]["overall"]["HR@10"] == 0.07


def test_bad_input_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no ledger at"):
        cc.collect(tmp_path / "nowhere", tmp_path / "dst")
    src = tmp_path / "src"
    src.mkdir()
    (src / "ledger.jsonl").write_text('{"cell": "a/b/c/seed0", "status": "ran"\n')
    with pytest.raises(SystemExit, match=r"ledger.jsonl:1 is not a JSON line"):
        cc.collect(src, tmp_path / "dst")


def test_commit_message_names_the_figures():
    msg = cc.commit_message({"cell": "sports/bert4rec/bft_h/seed2", "status": "ran", "wall_s": 3175.2,
                             "git_sha": "5de5180c23"},
                            {"test": {"overall": {"HR@10": 0.03456}}, "best_epoch": 30, "epochs_run": 50})
    assert msg == ("paper_main: sports bert4rec bft_h seed2 (test HR@10 0.0346, best epoch 30 of 50; "
                   "3,175 s, status ran, at 5de5180)")
    resumed = cc.commit_message({"cell": "beauty/sasrec/bft/seed1", "status": "resumed", "wall_s": 293.4},
                                {"test": {"overall": {"HR@10": 0.095}}, "best_epoch": 33, "epochs_run": 43})
    assert "; 293 s in its last segment, status resumed, at ?)" in resumed  # not the run's whole time
    assert cc.commit_message({"cell": "ml-100k/sasrec/bft/rate0.1/seed2", "status": "ran", "wall_s": 9.0},
                             {"test": {"overall": {"HR@10": 0.5}}, "best_epoch": 3, "epochs_run": 5}).startswith(
        "paper_main: ml-100k sasrec bft rate0.1 seed2 (test HR@10 0.5000")


def test_a_rerun_cell_is_collected_once_with_its_last_line(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _cell(src, "yelp/hstu/bft/seed1", "ran", "2026-12-04T01:00:00")
    with (src / "ledger.jsonl").open("a") as f:  # the same cell finished again later (deleted and rerun)
        f.write(json.dumps({"cell": "yelp/hstu/bft/seed1", "status": "ran", "written": "2026-12-04T05:00:00",
                            "wall_s": 9.0, "git_sha": "1234567abc"}) + "\n")
    assert cc.collect(src, dst) == ["yelp/hstu/bft/seed1"]
    assert cc.collect(src, dst) == []  # the earlier line of the same cell is not collected on a second pass
    (line,) = (dst / "ledger.jsonl").read_text().splitlines()
    assert json.loads(line)["written"] == "2026-12-04T05:00:00"


def test_a_cell_outside_the_sweep_is_refused_and_the_source_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    outside = tmp_path / "elsewhere" / "run"
    outside.mkdir(parents=True)
    (outside / "metrics.json").write_text("{}")
    (src / "ledger.jsonl").write_text(json.dumps({"cell": str(outside), "status": "ran", "written": "t"}) + "\n")
    with pytest.raises(SystemExit, match=r"not a dataset/model/layer/\[variant/\]seedK path"):
        cc.collect(src, tmp_path / "dst")
    assert (outside / "metrics.json").exists()
    (src / "ledger.jsonl").write_text(json.dumps({"cell": "a/b/c/rate0.1", "status": "ran", "written": "t"}) + "\n")
    with pytest.raises(SystemExit, match="not a dataset/model/layer"):  # the last part names no seed
        cc.collect(src, tmp_path / "dst")
    (src / "ledger.jsonl").write_text('["not", "a", "record"]\n')
    with pytest.raises(SystemExit, match="is not a ledger record"):
        cc.collect(src, tmp_path / "dst")


def test_a_metrics_file_missing_a_field_is_refused_before_copying(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _cell(src, "toys/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00")
    (src / "toys/sasrec/bft/seed0/metrics.json").write_text('{"best_epoch": 3}')
    with pytest.raises(SystemExit, match="lacks 'test'"):
        cc.collect(src, dst)
    (src / "toys/sasrec/bft/seed0/metrics.json").write_text('{"best_epoch": 3')  # torn
    with pytest.raises(SystemExit, match="metrics.json is not valid JSON"):
        cc.collect(src, dst)
    assert not (dst / "toys").exists() and not (dst / "ledger.jsonl").exists()


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_commit_takes_only_the_cell_and_keeps_the_users_staging(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.org")
    _git(repo, "config", "user.name", "t")
    (repo / "notes.txt").write_text("staged by the user\n")
    _git(repo, "add", "notes.txt")
    src, dst = tmp_path / "src", repo / "results" / "paper_main" / "runs"
    src.mkdir()
    _cell(src, "toys/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00")
    assert cc.collect(src, dst, commit=True) == ["toys/sasrec/bft/seed0"]
    assert _git(repo, "log", "--format=%s").startswith("paper_main: toys sasrec bft seed0 (test HR@10 0.0500")
    committed = set(_git(repo, "show", "--name-only", "--format=", "HEAD").split())
    assert "results/paper_main/runs/ledger.jsonl" in committed and "notes.txt" not in committed
    assert not any(p.endswith(".pt") for p in committed)
    assert "A  notes.txt" in _git(repo, "status", "--porcelain")  # still staged, not committed


def test_commit_outside_a_repository_fails_in_one_line_before_copying(tmp_path, monkeypatch, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _cell(src, "toys/sasrec/bft/seed0", "ran", "2026-12-04T01:00:00")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert cc.main(["--src", str(src), "--dst", str(dst), "--commit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop --commit" in err[0]
    assert not (dst / "toys").exists() and not (dst / "ledger.jsonl").exists()
