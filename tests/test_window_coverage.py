"""scripts/window_coverage.py: targets predicted per epoch under each training-window mode."""
import json
import os

import numpy as np
import pytest

from tests.scripts import load_script

wc = load_script("window_coverage", "results/windows")


def test_sliding_predicts_every_target_once_and_last_the_most_recent_max_len():
    lengths = np.array([3, 4, 12, 13, 14, 40, 7])  # full sequences: training part = length - 2
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    max_len = 5
    r = wc.coverage(offsets, max_len)
    n = lengths - 2
    assert r["targets"] == (n - 1).sum()
    assert r["sliding"]["targets_predicted"] == r["targets"] and r["sliding"]["share_of_targets"] == 1.0
    assert r["last"]["targets_predicted"] == np.minimum(n - 1, max_len).sum() < r["targets"]
    assert r["last"]["windows"] == len(lengths) < r["sliding"]["windows"]
    assert r["users_longer_than_a_window"] == round(float((n > max_len + 1).mean()), 4)


@pytest.mark.data
@pytest.mark.skipif(not os.environ.get("BFTREC_DATA_ROOT"), reason="BFTREC_DATA_ROOT is not set (CI sets it)")
def test_cli_writes_json_for_a_real_dataset(tmp_path):
    out = tmp_path / "c.json"
    assert wc.main(["--datasets", "ml-100k", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["datasets"]["ml-100k"]
    assert r["users"] == 943 and 0.5 < r["last"]["share_of_targets"] < 0.75  # mean length 106 > max_len 100


def test_a_tuned_config_without_max_len_takes_the_model_default(tmp_path):
    out = tmp_path / "s.json"
    assert wc.main(["--datasets", "synthetic", "--out", str(out)]) == 0  # synthetic_sasrec.yaml sets no max_len
    r = json.loads(out.read_text())["datasets"]["synthetic"]
    assert r["max_len"] == 50 and r["sliding"]["share_of_targets"] == 1.0
