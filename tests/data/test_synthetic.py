"""The embedded synthetic dataset: seeded, fast, power-law, short users, learnable transitions."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from bftrec.data.config import DatasetConfig, SyntheticConfig
from bftrec.data.datasets import load_dataset
from bftrec.data.synthetic import generate


@pytest.fixture(scope="module")
def data():
    return load_dataset(DatasetConfig())


def test_deterministic_for_a_seed_and_different_for_another():
    a, b = generate(SyntheticConfig(seed=3)), generate(SyntheticConfig(seed=3))
    pd.testing.assert_frame_equal(a, b)
    c = generate(SyntheticConfig(seed=4))
    assert len(a) != len(c) or not a.equals(c)


def test_generation_is_fast():
    start = time.perf_counter()
    generate(SyntheticConfig())
    assert time.perf_counter() - start < 2.0


def test_canonical_frame():
    df = generate(SyntheticConfig(n_users=50, n_items=40))
    assert list(df.columns) == ["user", "item", "timestamp"]
    assert df["timestamp"].dtype == np.int64 and isinstance(df["user"].iloc[0], str)
    assert df["user"].nunique() == 50


def test_power_law_popularity(data):
    counts = np.sort(np.bincount(data.items, minlength=data.n_items + 1)[1:])[::-1]
    top = counts[: len(counts) // 10].sum() / counts.sum()
    assert top > 0.4


def test_many_short_users_among_long_ones(data):
    lengths = data.lengths
    assert lengths.min() >= 3
    assert (lengths <= 8).mean() > 0.45
    assert (lengths >= 30).sum() >= 100 and lengths.max() <= 200


def test_timestamps_strictly_increase_per_user(data):
    t = data.timestamps
    same_user = np.ones(len(t) - 1, dtype=bool)
    same_user[data.offsets[1:-1] - 1] = False
    assert (np.diff(t)[same_user] > 0).all()
    assert data.stats["tie_rate"] == 0.0 and data.stats["has_timestamps"]


def test_transitions_are_learnable(data):
    """The 5 most frequent successors of the previous item (counted on training data) predict the
    next item far more often than the 5 most popular items do."""
    valid = data.split("valid")
    pairs = []
    for u in range(data.n_users):
        s = valid.items[valid.offsets[u]:valid.offsets[u + 1]]
        pairs.append(np.stack([s[:-1], s[1:]], axis=1))
    p = np.concatenate(pairs)
    n = data.n_items + 1
    table = np.zeros((n, n), dtype=np.int64)
    np.add.at(table, (p[:, 0], p[:, 1]), 1)
    top_succ = np.argsort(-table, axis=1, kind="stable")[:, :5]
    test = data.split("test")
    last = test.items[test.offsets[1:] - 1]
    hit_succ = (top_succ[last] == test.targets[:, None]).any(axis=1).mean()
    top_pop = np.argsort(-data.train_counts(), kind="stable")[:5]
    hit_pop = np.isin(test.targets, top_pop).mean()
    assert hit_succ > 0.45 and hit_succ > 2 * hit_pop


@pytest.mark.parametrize("bad", [dict(p_transition=0.8, noise=0.3), dict(short_min_len=2),
                                 dict(n_successors=0), dict(short_user_share=1.5)])
def test_impossible_settings_raise(bad):
    with pytest.raises(ValueError, match="synthetic settings need"):
        DatasetConfig(synthetic=SyntheticConfig(**bad))
