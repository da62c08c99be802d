"""The data a run used is part of its identity (issue 50 item 1): a re-score, a resume or a table on other data
stops in one line naming both hashes and the fix, unless the override is given, and then the output says so."""
import json

import pytest
import torch

from bftrec.config import ConfigError
from bftrec.data.config import DatasetConfig
from bftrec.data.datasets import data_identity, load_dataset, other_data
from bftrec.evaluate import rescore
from bftrec.experiment import run
from bftrec.report import tables
from tests.test_train_e2e import smoke_cfg


def _tamper(path, where):
    """Rewrite the data fingerprint a checkpoint recorded, as if the run had trained on other data."""
    ck = torch.load(path, weights_only=False)
    where(ck)["fingerprint"] = "f" * 64
    torch.save(ck, path)


def test_the_fingerprint_follows_the_data_not_the_name():
    a, b = load_dataset(DatasetConfig()), load_dataset(DatasetConfig(inject_rate=0.1))
    assert data_identity(a)["fingerprint"] == data_identity(load_dataset(DatasetConfig()))["fingerprint"]
    assert other_data(data_identity(a), data_identity(b)).startswith("data fingerprint")
    assert other_data(None, data_identity(a)) is None  # a run older than the record is not refused


def test_rescore_on_other_data_stops_unless_allowed(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    _tamper(tmp_path / "run" / "checkpoint.pt", lambda ck: ck["data"])
    with pytest.raises(ConfigError, match="data fingerprint .* here, ffffffffffff in the run.*--allow-other-data") as e:
        rescore(tmp_path / "run", [], tmp_path / "re")
    assert "\n" not in str(e.value)
    m = rescore(tmp_path / "run", [], tmp_path / "re2", allow_other_data=True)
    assert m["other_data"]["allowed"] is True
    assert json.loads((tmp_path / "re2" / "metrics.json").read_text())["other_data"]["difference"].startswith("data")


def test_resume_on_other_data_stops_in_one_line(tmp_path):
    run(smoke_cfg(tmp_path, "trainer.epochs=1"), tmp_path / "a")
    _tamper(tmp_path / "a" / "last.pt", lambda ck: ck["state"]["data"])
    with pytest.raises(ConfigError, match="trainer.resume=.*data fingerprint .*BFTREC_DATA_ROOT") as e:
        run(smoke_cfg(tmp_path, "trainer.epochs=2", f"trainer.resume={tmp_path / 'a'}"), tmp_path / "b")
    assert "\n" not in str(e.value)


def test_tables_never_pool_seeds_trained_on_different_data(tmp_path):
    import shutil

    for seed in (0, 1):
        run(smoke_cfg(tmp_path, f"seed={seed}"), tmp_path / "runs" / f"seed{seed}")
    m = tmp_path / "runs" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    d["data"]["fingerprint"] = "f" * 64
    m.write_text(json.dumps(d))
    with pytest.raises(SystemExit, match="trained on different data"):
        tables.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
    shutil.rmtree(tmp_path / "runs" / "seed1")
    tables.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])


def test_a_finished_grid_cell_on_other_data_is_not_skipped_silently(tmp_path):
    """issue 50: a grid relaunched on another data root refuses the finished cell instead of skipping it."""
    rows = [f"u{u}\ti{(u * 3 + t) % 40 + 1}\t{1_600_000_000 + 60 * t}" for u in range(60) for t in range(8)]
    (tmp_path / "mini.tsv").write_text("\n".join(rows) + "\n")
    over = ["dataset.format=tsv", "dataset.path=mini.tsv", f"data_root={tmp_path}", "skip_finished=true",
            "eval.n_bins=2"]
    run(smoke_cfg(tmp_path, *over), tmp_path / "cell")
    run(smoke_cfg(tmp_path, *over), tmp_path / "cell")  # the same data: skipped
    (tmp_path / "mini.tsv").write_text("\n".join(rows[::-1][:1] + rows[1:]) + "\n")  # other contents, same name
    with pytest.raises(ConfigError, match="holds a finished run on other data .*sha256") as e:
        run(smoke_cfg(tmp_path, *over), tmp_path / "cell")
    assert "\n" not in str(e.value) and not (tmp_path / "cell" / "FAILED").exists()
