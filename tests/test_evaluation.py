"""Evaluator: full ranking with history exclusion, repeat targets, chunking, sampled protocol."""
import numpy as np
import pytest
import torch
from torch import nn

from bftrec.config import ConfigError, EvalConfig
from bftrec.data.batches import history_pairs, loo_split, train_windows, windows
from bftrec.evaluation import rank_users, sample_candidates


class LastItemScorer(nn.Module):
    """Scores depend only on the last history item: W[last] (B, N + 1)."""

    def __init__(self, n_items: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W = nn.Parameter(torch.randn(n_items + 1, n_items + 1, generator=g))

    def score_items(self, batch):
        s = self.W[batch["item_seq"][:, -1]].clone()
        s[:, 0] = float("-inf")
        return s

    def mechanism(self, batch):
        return {}


def toy_sequences(n_users=50, n_items=30, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 12, n_users)
    items = rng.integers(1, n_items + 1, lens.sum()).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return items, offsets


def ranks(model, items, offsets, n_items, which="test", **kw):
    cfg = EvalConfig(**kw)
    counts = np.bincount(items, minlength=n_items + 1)
    return rank_users(model, items, offsets, None, which, n_items, 8, counts, cfg, torch.device("cpu"))


def test_splits_and_windows():
    items = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.int64)
    offsets = np.array([0, 4, 7])
    test = loo_split(items, offsets, "test")
    valid = loo_split(items, offsets, "valid")
    assert test.targets.tolist() == [4, 7] and valid.targets.tolist() == [3, 6]
    assert test.history_len.tolist() == [3, 2] and valid.history_len.tolist() == [2, 1]
    assert windows(items, test.start, test.end, 4).tolist() == [[0, 1, 2, 3], [0, 0, 5, 6]]
    assert train_windows(items, offsets, 3).tolist() == [[0, 1, 2], [0, 0, 5]]
    rows, cols = history_pairs(items, test.start, test.end)
    assert rows.tolist() == [0, 0, 0, 1, 1] and cols.tolist() == [1, 2, 3, 5, 6]
    with pytest.raises(ValueError, match="needs >= 3"):
        loo_split(items, np.array([0, 2, 7]), "test")


def test_rank_matches_brute_force_with_history_exclusion():
    items, offsets = toy_sequences()
    n = 30
    model = LastItemScorer(n)
    table = ranks(model, items, offsets, n)
    split = loo_split(items, offsets, "test")
    for r in range(len(split.users)):
        hist = items[split.start[r]:split.end[r]]
        s = model.W[hist[-1]].detach().numpy().copy()
        t = split.targets[r]
        cand = [i for i in range(1, n + 1) if i == t or i not in set(hist.tolist())]
        expected = 1 + sum(1 for i in cand if i != t and s[i] >= s[t])
        assert table["rank"][r] == expected


def test_exclude_scope_window_keeps_older_history_rankable():
    """eval.exclude_scope=window (the HSTU reference) excludes only the scored window's items (max_len = 8 in
    ``ranks``): brute force over users whose history is longer than the window and shorter."""
    items, offsets = toy_sequences(n_users=80)
    n = 30
    model = LastItemScorer(n)
    window = ranks(model, items, offsets, n, exclude_scope="window")
    whole = ranks(model, items, offsets, n)
    split = loo_split(items, offsets, "test")
    assert (split.history_len > 8).sum() >= 10 and (split.history_len <= 8).sum() >= 10
    for r in range(len(split.users)):
        hist = items[split.start[r]:split.end[r]]
        s = model.W[hist[-1]].detach().numpy().copy()
        t = split.targets[r]
        seen = set(hist[-8:].tolist())
        expected = 1 + sum(1 for i in range(1, n + 1) if i != t and i not in seen and s[i] >= s[t])
        assert window["rank"][r] == expected
        if len(hist) <= 8:
            assert window["rank"][r] == whole["rank"][r]
    assert (window["rank"] > whole["rank"]).any()  # an older history item outranks a target
    with pytest.raises(ConfigError, match="eval.exclude_scope"):
        ranks(model, items, offsets, n, exclude_scope="recent")
    with pytest.raises(ConfigError, match="applies to full ranking"):
        ranks(model, items, offsets, n, exclude_scope="window", protocol="sampled100", n_negatives=5)


def test_metrics_independent_of_eval_batch_size():
    items, offsets = toy_sequences()
    model = LastItemScorer(30)
    a = ranks(model, items, offsets, 30, batch_size=7)
    b = ranks(model, items, offsets, 30, batch_size=1000)
    assert a.equals(b)


def test_repeat_target_keep_vs_mask():
    # user 0: history [1, 2], target 2 (a repeat); user 1: no repeat
    items = np.array([5, 1, 2, 2, 3, 4, 6, 7], dtype=np.int64)
    offsets = np.array([0, 4, 8])
    model = LastItemScorer(10)
    keep = ranks(model, items, offsets, 10, repeat_target="keep", ks=[5])
    mask = ranks(model, items, offsets, 10, repeat_target="mask", ks=[5])
    assert keep["rank"][0] <= 10 and mask["rank"][0] == 11  # masked repeat counts as a miss
    assert keep["rank"][1] == mask["rank"][1]
    no_excl = ranks(model, items, offsets, 10, exclude_history=False, ks=[5])
    assert (no_excl["rank"] >= keep["rank"]).all()  # more candidates can only worsen ranks


def test_non_finite_score_raises():
    items, offsets = toy_sequences()
    model = LastItemScorer(30)
    with torch.no_grad():
        model.W[:, 5] = float("nan")
    with pytest.raises(ValueError, match="non-finite score"):
        ranks(model, items, offsets, 30)


def test_sampled_candidates_fixed_and_exclude_history():
    items, offsets = toy_sequences(n_items=300)
    split = loo_split(items, offsets, "test")
    counts = np.bincount(items, minlength=301)
    cfg = EvalConfig(protocol="sampled100")
    a = sample_candidates(items, split, 300, cfg, counts)
    b = sample_candidates(items, split, 300, cfg, counts)
    assert np.array_equal(a, b) and a.shape == (len(split.users), 101)
    for r in range(len(split.users)):
        hist = set(items[split.start[r]:split.end[r]].tolist())
        assert a[r, 0] == split.targets[r]
        assert not (set(a[r, 1:].tolist()) & (hist | {split.targets[r]}))
        assert len(set(a[r, 1:].tolist())) == 100
    table = ranks(LastItemScorer(300), items, offsets, 300, protocol="sampled100")
    assert table["rank"].between(1, 101).all()


def test_k_larger_than_items_raises():
    items, offsets = toy_sequences()
    with pytest.raises(ValueError, match="K"):
        ranks(LastItemScorer(30), items, offsets, 30, ks=[10, 50])


class RoundedScorer(LastItemScorer):
    """Integer scores in -2..2 (plus a constant ``offset``): most items tie with the target."""

    def __init__(self, n_items: int, offset: float = 0.0) -> None:
        super().__init__(n_items)
        with torch.no_grad():
            self.W.copy_(self.W.round().clamp(-2, 2) + offset)


@pytest.mark.parametrize("offset", [0.0, 1e38])  # 1e38: the row sums overflow, the scores stay finite
def test_pessimistic_ties_exact_and_independent_of_batch_size(offset: float) -> None:
    items, offsets = toy_sequences(n_users=40)
    n = 30
    model = RoundedScorer(n, offset)
    split = loo_split(items, offsets, "test")
    expected = []
    for r in range(len(split.users)):
        hist = set(items[split.start[r]:split.end[r]].tolist())
        s = model.W[items[split.end[r] - 1]].detach().numpy()
        t = split.targets[r]
        expected.append(1 + sum(1 for i in range(1, n + 1) if i != t and i not in hist and s[i] >= s[t]))
    for bs in (3, 7, 1000):
        assert ranks(model, items, offsets, n, batch_size=bs)["rank"].tolist() == expected, bs


def test_minus_inf_score_raises():
    items, offsets = toy_sequences()
    model = LastItemScorer(30)
    with torch.no_grad():
        model.W[:, 7] = float("-inf")
    with pytest.raises(ValueError, match="non-finite score -inf .* item 7"):
        ranks(model, items, offsets, 30, exclude_history=False)


def test_backbone_ranks_match_ranks_from_scores_with_reused_buffer():
    """SASRec scores through the reused score buffer (chunks of 4, 16 and one) equal a plain scoring."""
    import bftrec.models  # noqa: F401
    from bftrec.layers import LAYER_CONFIGS
    from bftrec.metrics import ranks_from_scores
    from bftrec.models import MODELS, DataInfo

    items, offsets = toy_sequences(n_users=16)
    n = 30
    torch.manual_seed(0)
    cls = MODELS.get("sasrec")
    model = cls(cls.Config(d_model=8, n_layers=1, n_heads=1, d_ff=16, max_len=8), LAYER_CONFIGS["standard"](),
                DataInfo(n_items=n, train_counts=np.bincount(items, minlength=n + 1)))
    split = loo_split(items, offsets, "test")
    with torch.no_grad():
        s = model.eval().score_items({"item_seq": torch.from_numpy(windows(items, split.start, split.end, 8))})
    rows, cols = history_pairs(items, split.start, split.end)
    keep = cols != split.targets[rows]
    s[rows[keep], cols[keep]] = float("-inf")
    expected = ranks_from_scores(s, torch.from_numpy(split.targets)).tolist()
    for bs in (4, 16, 1):
        assert ranks(model, items, offsets, n, batch_size=bs)["rank"].tolist() == expected, bs


def test_full_scores_reuses_one_buffer_only_inside_the_block():
    from bftrec.models.base import full_scores, reused_score_buffer

    g = torch.Generator().manual_seed(0)
    table, bias = torch.randn(11, 4, generator=g), torch.randn(11, generator=g)
    h1, h2 = torch.randn(3, 4, generator=g), torch.randn(2, 4, generator=g)
    ref = full_scores(h2, table, 10, bias)
    pool: dict = {}
    with torch.no_grad():
        with reused_score_buffer(pool):
            a = full_scores(h1, table, 10, bias).data_ptr()
        with reused_score_buffer(pool):
            b = full_scores(h2, table, 10, bias)
        assert b.data_ptr() == a  # the second chunk wrote into the first one's block
        torch.testing.assert_close(b, ref)
        assert full_scores(h1, table, 10, bias).data_ptr() != a  # outside the block: fresh
    with reused_score_buffer(pool):  # with gradients enabled: fresh, differentiable
        assert full_scores(h1, table.requires_grad_(), 10).requires_grad
