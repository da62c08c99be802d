"""scripts/device_pack.py: what comes back from a borrowed GPU machine is every cell's small files and the
checkpoints of the cells a deadline cut, within the limits on what comes back."""
import tarfile

from tests.scripts import load_script

dp = load_script("device_pack")


def _cell(root, name, epochs, finished, pt_bytes=1000):
    cell = root / "runs" / name
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "config.yaml").write_text("x: 1\n")
    (cell / "config.yaml").write_text("seed: 0\n")
    (cell / "history.csv").write_text("epoch,loss\n" + "".join(f"{e},0.5\n" for e in range(1, epochs + 1)))
    (cell / "last.pt").write_bytes(bytes(pt_bytes))
    (cell / "checkpoint.pt").write_bytes(bytes(pt_bytes))
    if finished:
        (cell / "metrics.json").write_text("{}")
    return cell


def _names(path):
    with tarfile.open(path) as tar:
        return sorted(tar.getnames())


def test_small_files_of_all_cells_and_checkpoints_of_unfinished_ones(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    _cell(work, "a/sasrec/bft/seed1", 5, finished=True)
    _cell(work, "a/sasrec/standard/seed1", 3, finished=False)
    _cell(work, "a/hstu/bft/seed1", 9, finished=False)
    (work / "runs" / "ledger.jsonl").write_text("{}\n")
    (out / "machine.txt").write_text("gpu\n")
    assert dp.main(work, out) == 0
    small = _names(out / "cells.tgz")
    assert "runs/ledger.jsonl" in small and "runs/a/sasrec/bft/seed1/metrics.json" in small
    assert not [n for n in small if n.endswith(".pt")]
    # the unfinished cells' checkpoints, most epochs first, in one archive (they fit 15 MiB), numbered
    # after the two files already in OUT; none of the finished cell
    assert _names(out / "ckpt_2.tgz") == ["runs/a/hstu/bft/seed1/checkpoint.pt", "runs/a/hstu/bft/seed1/last.pt",
                                          "runs/a/sasrec/standard/seed1/checkpoint.pt",
                                          "runs/a/sasrec/standard/seed1/last.pt"]
    assert sorted(p.name for p in out.iterdir()) == ["cells.tgz", "ckpt_2.tgz", "machine.txt"]


def test_checkpoints_over_the_limits_stay_behind(tmp_path, monkeypatch, caplog):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    for k in range(4):
        _cell(work, f"a/m/l/seed{k}", 10 - k, finished=False, pt_bytes=200_000)
    _cell(work, "a/m/l/seed9", 1, finished=False).joinpath("last.pt").unlink()  # killed in its first epoch
    monkeypatch.setattr(dp, "MAX_FILE", 900_000)  # two cells' checkpoints (2 x 400 kB raw) per archive
    monkeypatch.setattr(dp, "MAX_FILES", 2)  # cells.tgz + one checkpoint archive
    assert dp.main(work, out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["cells.tgz", "ckpt_1.tgz"]
    assert {n.split("/")[4] for n in _names(out / "ckpt_1.tgz")} == {"seed0", "seed1"}  # the most epochs
    assert "left behind (limits): runs/a/m/l/seed2 (8 epochs)" in caplog.text
    assert "left behind (limits): runs/a/m/l/seed3 (7 epochs)" in caplog.text
    assert "seed9" not in caplog.text  # nothing to resume, so nothing left behind


def test_missing_folders_are_one_line(tmp_path):
    import subprocess
    import sys

    from tests.scripts import SCRIPTS

    r = subprocess.run([sys.executable, str(SCRIPTS / "device_pack.py"), str(tmp_path / "nowork"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        f"device_pack: WORK (the grid's out_root) {tmp_path / 'nowork'} is not a folder; pass existing folders"]
    assert not list(tmp_path.iterdir())  # nothing written
