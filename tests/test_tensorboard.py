"""trainer.tensorboard=true (issue 48 item 4): event files TensorBoard reads back; off by default; a missing
package is one line before training. The test that reads events needs the optional extra and is skipped
without it (CI stays free of extras)."""
import importlib.util

import pytest

from bftrec.config import ConfigError
from bftrec.experiment import run
from tests.test_train_e2e import smoke_cfg


def test_off_by_default_and_no_event_files(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_missing_package_is_one_line_before_training(tmp_path, monkeypatch):
    import bftrec.tensorboard as tb

    monkeypatch.setattr(tb.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"trainer.tensorboard=true needs the tensorboard package: pip install"):
        run(smoke_cfg(tmp_path, "trainer.tensorboard=true"), tmp_path / "run")
    assert not (tmp_path / "run" / "history.csv").exists()  # no epoch ran


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="the optional tensorboard extra")
def test_event_files_hold_loss_validation_and_the_bft_mechanism(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(smoke_cfg(tmp_path, "layer=bft", "trainer.epochs=2", "trainer.tensorboard=true"), tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "valid/NDCG@10", "valid/HR@10", "bft/K/layer0", "bft/lambda0_mean"} <= tags, tags
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]
    assert all(0 < e.value <= 1 for e in acc.Scalars("bft/K/layer0"))
