"""The BFT mechanism read at the scoring position, grouped by the test target (issue 46 item 4)."""
import numpy as np
import pytest
import torch

from bftrec.mechanism import aggregate_mechanism, score_position
from bftrec.models import MODELS
from tests.test_contract import BATCH, Factory, batches

BINS = [{"bin": "Q0", "lo": 0, "hi": 1, "n_items": 2}, {"bin": "Q1", "lo": 2, "hi": 9, "n_items": 1}]
COUNTS = np.array([0, 1, 1, 9])  # training count per item id; item 3 is frequent


def _sink():
    """Two users, one block: token K = 0.5 everywhere, but K at the scoring position 0.9 and 0.1."""
    items = torch.tensor([[0, 1, 2, 3], [0, 0, 3, 3]])  # (B, L), 0 is padding
    mech = {"units": "count", "lam0": torch.ones(2, 4), "layers": [{"K": torch.full((2, 4), 0.5)}],
            "at_score": {"K": torch.tensor([[0.9, 0.1]]), "lam0": torch.tensor([2.0, 6.0])}}
    return [{"mech": mech, "item_seq": items, "users": np.array([0, 1])}]


def test_at_target_groups_users_by_their_test_target_not_by_history_tokens():
    # user 0's target is rare (count 1, Q0), user 1's frequent (count 9, Q1); user 1 is cold (history 2 <= 2)
    out = aggregate_mechanism(_sink(), COUNTS, BINS, np.array([3, 2]), 2, target_count=np.array([1, 9]))
    at = out["at_target"]
    q0, q1 = at["by_target_freq"]
    assert (q0["n_users"], q0["K"], q0["lam0"]) == (1, pytest.approx(0.9), pytest.approx(2.0))
    assert (q1["n_users"], q1["K"], q1["lam0"]) == (1, pytest.approx(0.1), pytest.approx(6.0))
    assert at["cold_users"]["K"] == pytest.approx(0.1) and at["warm_users"]["K"] == pytest.approx(0.9)
    assert at["overall"]["K"] == pytest.approx(0.5) and at["overall"]["K_per_layer"] == [pytest.approx(0.5)]
    assert out["by_item_freq"][0]["K"] == pytest.approx(0.5)  # the by-token grouping is unchanged
    assert set(out["groupings"]) == {"by_item_freq", "at_target"}


def test_without_target_counts_or_scoring_values_there_is_no_at_target():
    assert "at_target" not in aggregate_mechanism(_sink(), COUNTS, BINS, np.array([3, 2]), 2)
    sink = _sink()
    del sink[0]["mech"]["at_score"]
    out = aggregate_mechanism(sink, COUNTS, BINS, np.array([3, 2]), 2, target_count=np.array([1, 9]))
    assert "at_target" not in out and set(out["groupings"]) == {"by_item_freq"}


def test_score_position_takes_the_last_column_of_every_block():
    mech = {"lam0": torch.arange(6.0).reshape(2, 3), "layers": [{"K": torch.arange(6.0).reshape(2, 3) / 10}] * 2}
    at = score_position(mech)["at_score"]
    assert torch.equal(at["lam0"], torch.tensor([2.0, 5.0]))
    assert at["K"].shape == (2, 2) and torch.allclose(at["K"][1], torch.tensor([0.2, 0.5]))
    assert "at_score" not in score_position({})  # a standard stack reports nothing


@pytest.mark.parametrize("name", ["sasrec", "hstu"])
def test_causal_backbones_report_the_last_history_position(name):
    model = Factory(MODELS.get(name), "bft")().eval()
    _, score = batches()
    mech = model.mechanism(score)
    assert mech["at_score"]["K"].shape == (model.cfg.n_layers, BATCH)
    for i, layer in enumerate(mech["layers"]):
        torch.testing.assert_close(mech["at_score"]["K"][i], layer["K"][:, -1])
    torch.testing.assert_close(mech["at_score"]["lam0"], mech["lam0"][:, -1])
