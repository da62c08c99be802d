"""The classic baselines: ``pop`` and ``markov`` against hand-computed rankings, their counts kept in a
checkpoint, and a counted run end to end (the contract suite covers their shapes and invariances)."""
import io
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from bftrec.config import ConfigError
from bftrec.experiment import run
from bftrec.layers import LAYER_CONFIGS
from bftrec.models import MODELS, DataInfo
from bftrec.models.markov import transition_counts
from tests.test_train_e2e import smoke_cfg

COUNTS = np.array([0, 3, 5, 5, 1, 0], dtype=np.int64)  # items 1..5; 2 and 3 tie, 5 never trained on


def _model(name: str):
    cls = MODELS.get(name)
    return cls(cls.Config(), LAYER_CONFIGS["standard"](), DataInfo(n_items=5, train_counts=COUNTS))


def _ranking(scores: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.argsort(scores, descending=True, stable=True) if scores[i] > -math.inf]


def test_pop_ranks_by_training_count_ties_to_the_smaller_id():
    s = _model("pop").score_items({"item_seq": torch.tensor([[0, 4, 1], [0, 0, 0]])})
    assert torch.isneginf(s[:, 0]).all() and torch.equal(s[0], s[1])  # every user the same list
    assert _ranking(s[0]) == [2, 3, 1, 4, 5]


def test_pop_keeps_every_tie_apart_at_large_counts():
    """3,706 items all trained on 3,000 times: a count plus a fractional tie-break would merge neighbours in
    float32; the rank scores keep every item distinct, smaller id first."""
    from bftrec.models.pop import popularity_scores

    s = popularity_scores(np.r_[0, np.full(3706, 3000)])
    assert s[1:].unique().numel() == 3706 and _ranking(s)[:3] == [1, 2, 3]


def test_transition_counts_stay_within_each_user():
    # user 0: 1 2 3 2 3; user 1: 4 2 1 (its first item does not follow user 0's last)
    items = np.array([1, 2, 3, 2, 3, 4, 2, 1])
    indptr, indices, counts = transition_counts(items, np.array([0, 5]), np.array([5, 8]), 5)
    pairs = {(a, int(indices[k])): float(counts[k]) for a in range(6) for k in range(indptr[a], indptr[a + 1])}
    assert pairs == {(1, 2): 1.0, (2, 3): 2.0, (3, 2): 1.0, (4, 2): 1.0, (2, 1): 1.0}


def test_markov_follows_the_last_item_and_backs_off_to_popularity():
    m = _model("markov")
    m.fit_statistics(np.array([1, 2, 3, 2, 3, 4, 2, 1]), np.array([0, 5]), np.array([5, 8]))
    s = m.score_items({"item_seq": torch.tensor([[0, 4, 2], [0, 0, 5], [0, 0, 0]])})
    assert _ranking(s[0]) == [3, 1, 2, 4, 5]  # 2 → 3 twice, 2 → 1 once, then popularity (2, 4, 5)
    b = m.scores  # the popularity back-off: ranks: 5 for the most popular item (2), 1 for the least (5)
    assert b[1:].tolist() == [3.0, 5.0, 4.0, 2.0, 1.0]  # counts 3, 5, 5, 1, 0: 2 before 3 on the tie
    assert s[0, 3] == 2 * 6 + b[3] and s[0, 1] == 1 * 6 + b[1] and s[0, 4] == b[4]  # count · (N + 1) + rank
    assert _ranking(s[1]) == _ranking(s[2]) == [2, 3, 1, 4, 5]  # no successor of 5, an empty history: popularity
    assert torch.isneginf(s[:, 0]).all() and torch.isfinite(s[:, 1:]).all()


def test_markov_counts_travel_in_the_state_dict():
    m = _model("markov")
    m.fit_statistics(np.array([1, 2, 3, 2, 3, 4, 2, 1]), np.array([0, 5]), np.array([5, 8]))
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    fresh = _model("markov")  # no counts yet: other buffer sizes
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    h = {"item_seq": torch.tensor([[0, 1, 2], [4, 3, 1]])}
    assert torch.equal(fresh.score_items(h), m.score_items(h))


@pytest.mark.parametrize("name", ["pop", "markov", "gru4rec"])
def test_no_transformer_layer_on_a_baseline(name):
    cls = MODELS.get(name)
    with pytest.raises(ConfigError, match=f"layer=bft is not available for model={name}.*use layer=standard"):
        cls(cls.Config(), LAYER_CONFIGS["bft"](), DataInfo(n_items=5, train_counts=COUNTS))


def test_a_counted_run_end_to_end_is_deterministic_and_says_nothing_was_trained(tmp_path):
    out = {}
    for seed in (0, 1):
        metrics = run(smoke_cfg(tmp_path, "model=markov", f"seed={seed}"), tmp_path / f"s{seed}")
        hist = pd.read_csv(tmp_path / f"s{seed}" / "history.csv")
        assert metrics["n_parameters"] == 0 and metrics["epochs_run"] == 1 and metrics["best_epoch"] == 1
        assert len(hist) == 1 and hist["loss"].isna().all() and hist["valid_NDCG@10"].notna().all()
        out[seed] = json.loads((tmp_path / f"s{seed}" / "metrics.json").read_text())["test"]["overall"]
    assert out[0] == out[1]  # counting has no randomness: the seed changes nothing


def test_gru4rec_refuses_no_layers_and_a_counted_model_refuses_training_flags(tmp_path):
    cls = MODELS.get("gru4rec")
    with pytest.raises(ConfigError, match="model.n_layers=0 must be >= 1"):
        cls(cls.Config(n_layers=0), LAYER_CONFIGS["standard"](), DataInfo(n_items=5, train_counts=COUNTS))
    with pytest.raises(ConfigError, match="Markov is counted, not trained: trainer.fused_optimizer, trainer.dropout"):
        run(smoke_cfg(tmp_path, "model=markov", "trainer.fused_optimizer=true", "trainer.dropout=mask"), tmp_path / "r")
