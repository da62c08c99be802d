"""scripts/time_gaps.py: pairs within each user's scoring window, consecutive gaps within users only."""
import numpy as np
import pytest

from tests.scripts import load_script


def test_pairs_and_consecutive_gaps_stay_within_users():
    tg = load_script("time_gaps", "results/hstu_time_bias")
    # user 0: 0, 0, 100; user 1: 5, 10, 4000. With max_len 2 the windows are (0, 100) and (10, 4000).
    ts, offsets = np.array([0, 0, 100, 5, 10, 4000]), np.array([0, 3, 6])
    assert sorted(tg.window_pairs(ts, offsets, 2).tolist()) == [100, 3990]
    assert sorted(tg.window_pairs(ts, offsets, 3).tolist()) == [0, 5, 100, 100, 3990, 3995]
    out = tg.summary(ts, offsets, 3, 128)
    assert out["pairs"] == 6 and out["share_bucket0"] == pytest.approx(1 / 6)
    assert out["share_under_60s"] == pytest.approx(2 / 6) and out["share_under_1h"] == pytest.approx(4 / 6)
    cons = out["consecutive"]  # 0, 100 | 5, 3990: the 100 -> 5 step between users is no gap
    assert cons["gaps"] == 4 and cons["share_bucket0"] == pytest.approx(1 / 4) and cons["median_s"] == 52.5


def test_unknown_dataset_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        load_script("time_gaps", "results/hstu_time_bias").main(["--datasets", "sportz",
                                                                  "--out", str(tmp_path / "x.json")])
    assert "time_gaps: error: unknown dataset 'sportz'" in str(e.value) and not (tmp_path / "x.json").exists()
