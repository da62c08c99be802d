"""Beyond-accuracy metrics of the recommended lists (issue 48 item 2), against hand-computed cases."""
import json

import numpy as np
import pytest

from bftrec.beyond import gini, list_metrics
from bftrec.experiment import run
from tests.test_train_e2e import smoke_cfg


def test_gini_hand_cases():
    assert gini([3, 3, 3, 3]) == 0.0
    assert gini([0, 0, 0, 8]) == pytest.approx(3 / 4)  # one item takes every slot: (n - 1) / n
    # sorted (1, 2, 3): (-2*1 + 0*2 + 2*3) / (3 * 6) = 4/18
    assert gini([3, 1, 2]) == pytest.approx(4 / 18)


def test_list_metrics_hand_case():
    # N = 5 items; counts: item 1 rare (1), item 2 rare (2), items 3-5 popular (10, 20, 30); tail = {1, 2}
    counts = np.array([0, 1, 2, 10, 20, 30])
    tail = np.array([False, True, True, False, False, False])
    lists = np.array([[1, 3], [3, 4]])  # two users, K = 2
    m = list_metrics(lists, 5, counts, tail, 2)
    assert m["coverage@2"] == pytest.approx(3 / 5)  # items 1, 3, 4 of 5
    assert m["tail_share@2"] == pytest.approx(1 / 4)  # one of four slots is a tail item
    assert m["popularity@2"] == pytest.approx((1 + 10 + 10 + 20) / 4)
    # recommended counts per item (1..5): 1, 0, 2, 1, 0 -> sorted 0, 0, 1, 1, 2, total 4
    assert m["gini@2"] == pytest.approx(((-4) * 0 + (-2) * 0 + 0 * 1 + 2 * 1 + 4 * 2) / (5 * 4))
    assert list_metrics(lists[:0], 5, counts, tail, 2)["coverage@2"] is None


def test_a_run_records_them_overall_and_per_stratum(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    b = m["beyond_accuracy"]
    assert b["k"] == 10 and len(b["by_item_freq"]) == len(m["test"]["by_item_freq"])
    assert 0 < b["overall"]["coverage@10"] <= 1 and 0 <= b["overall"]["tail_share@10"] <= 1
    assert 0 <= b["overall"]["gini@10"] < 1 and b["overall"]["popularity@10"] > 0
    assert {"cold_users", "warm_users"} <= set(b)
