"""scripts/time_gaps.py: gaps are taken within each user's sequence only."""
import numpy as np
import pytest

from tests.scripts import load_script


def test_gaps_are_within_users_only():
    tg = load_script("time_gaps")
    # user 0: 0, 0, 100 (gaps 0, 100); user 1: 5, 10 (gap 5); the 100 -> 5 step between users is no gap
    out = tg.gap_summary(np.array([0, 0, 100, 5, 10]), np.array([0, 3, 5]))
    assert out["gaps"] == 3 and out["median_s"] == 5
    assert out["share_0s"] == pytest.approx(1 / 3) and out["share_under_60s"] == pytest.approx(2 / 3)
    assert out["share_under_1h"] == 1 and out["share_over_1day"] == 0
