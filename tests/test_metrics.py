"""Tests for bftrec.metrics (DESIGN.md, "Evaluation protocol"): hand values, pessimistic ties,
non-finite scores, monotonicity in K, invariances, strata recombination, frequency bins and
cold users."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from bftrec.metrics import (
    BIN_MODES,
    assign_item_bins,
    check_k,
    cold_threshold,
    hit_rate,
    item_freq_bins,
    ndcg,
    ranks_from_scores,
    reciprocal_rank,
    stratify,
    summarize,
)


def _brute_ranks(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The definition, literally: 1 + #{c != target : score_c >= score_target}."""
    out = []
    for row, t in zip(scores, targets):
        others = np.delete(row, t)
        out.append(1 + int(np.sum(others >= row[t])))
    return np.array(out, dtype=np.int64)


# ------------------------------------------------------------------------------------------
# hand values
# ------------------------------------------------------------------------------------------
def test_hand_values():
    assert hit_rate(np.array([1]), 10).tolist() == [1.0]
    assert ndcg(np.array([1]), 10).tolist() == [1.0]
    assert ndcg(np.array([3]), 10)[0] == pytest.approx(0.5)
    assert hit_rate(np.array([11]), 10).tolist() == [0.0]
    assert ndcg(np.array([11]), 10).tolist() == [0.0]
    assert hit_rate(np.array([10]), 10).tolist() == [1.0]  # boundary is inclusive
    assert ndcg(np.array([10]), 10)[0] == pytest.approx(1 / math.log2(11))
    assert reciprocal_rank(np.array([1, 2, 4])).tolist() == [1.0, 0.5, 0.25]

    s = summarize(np.array([1, 2, 4]), ks=(1, 3))
    assert list(s) == ["HR@1", "NDCG@1", "HR@3", "NDCG@3", "MRR", "n_users"]
    assert s["MRR"] == pytest.approx((1 + 0.5 + 0.25) / 3)
    assert s["HR@1"] == pytest.approx(1 / 3)
    assert s["HR@3"] == pytest.approx(2 / 3)
    assert s["NDCG@3"] == pytest.approx((1 + 1 / math.log2(3)) / 3)
    assert s["n_users"] == 3
    assert all(type(v) is float for k, v in s.items() if k != "n_users")
    assert type(s["n_users"]) is int


def test_per_user_dtypes_and_inputs():
    r = np.array([1, 5, 30], dtype=np.int32)
    for f in (lambda x: hit_rate(x, 10), lambda x: ndcg(x, 10), reciprocal_rank):
        out = f(r)
        assert out.dtype == np.float64 and out.shape == (3,)
        np.testing.assert_array_equal(f(torch.tensor([1, 5, 30])), out)  # torch input is fine
    with pytest.raises(ValueError):
        hit_rate(r, 0)
    with pytest.raises(ValueError):
        ndcg(r, -1)
    with pytest.raises(TypeError):
        hit_rate(r, 2.5)
    with pytest.raises(ValueError, match=">= 1"):
        hit_rate(np.array([0, 1]), 10)  # rank 0 does not exist


def test_summarize_default_ks_and_empty():
    s = summarize(np.array([1, 7, 15, 100]))
    assert list(s) == [
        "HR@5",
        "NDCG@5",
        "HR@10",
        "NDCG@10",
        "HR@20",
        "NDCG@20",
        "MRR",
        "n_users",
    ]
    assert s["HR@5"] == 0.25 and s["HR@10"] == 0.5 and s["HR@20"] == 0.75
    empty = summarize(np.array([], dtype=np.int64))
    assert empty["n_users"] == 0
    assert all(empty[k] is None for k in empty if k != "n_users")
    json.dumps(empty, allow_nan=False)


# ------------------------------------------------------------------------------------------
# scores -> ranks
# ------------------------------------------------------------------------------------------
def test_constant_scores_get_zero_hit_rate():
    n_users, n_cand = 64, 100
    scores = torch.zeros(n_users, n_cand)
    targets = torch.randint(0, n_cand, (n_users,), generator=torch.Generator().manual_seed(0))
    ranks = ranks_from_scores(scores, targets)
    assert ranks.dtype == torch.int64 and ranks.shape == (n_users,)
    assert ranks.tolist() == [n_cand] * n_users  # every other candidate ties -> counts above
    s = summarize(ranks.numpy())
    assert s["HR@10"] == 0.0 and s["NDCG@10"] == 0.0


def test_ranks_match_definition_with_ties():
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 4, (200, 30), generator=g).float()  # very tie-heavy
    scores[torch.rand(200, 30, generator=g) < 0.2] = float("-inf")
    targets = torch.randint(0, 30, (200,), generator=g)
    scores[torch.arange(200), targets] = torch.randint(0, 4, (200,), generator=g).float()
    got = ranks_from_scores(scores, targets).numpy()
    np.testing.assert_array_equal(got, _brute_ranks(scores.numpy(), targets.numpy()))


def test_random_scores_give_about_k_over_n():
    n_users, n_items, k = 20_000, 1000, 10
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(n_users, n_items, generator=g)
    targets = torch.randint(0, n_items, (n_users,), generator=g)
    ranks = ranks_from_scores(scores, targets).numpy()
    p = k / n_items
    hr = hit_rate(ranks, k).mean()
    assert abs(hr - p) <= 3 * math.sqrt(p * (1 - p) / n_users)
    # the rank of a random target is uniform on 1..N
    assert abs(ranks.mean() - (n_items + 1) / 2) <= 3 * n_items / math.sqrt(12 * n_users)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("on_target", [False, True])
def test_nan_or_posinf_score_raises(bad, on_target):
    scores = torch.randn(5, 8)
    targets = torch.tensor([0, 1, 2, 3, 4])
    col = 3 if on_target else 6
    scores[3, col] = bad
    with pytest.raises(ValueError, match="row 3") as err:
        ranks_from_scores(scores, targets)
    msg = str(err.value)
    assert "\n" not in msg
    assert ("nan" if math.isnan(bad) else "inf") in msg


def test_masked_target_raises():
    scores = torch.randn(4, 6)
    targets = torch.tensor([5, 4, 3, 2])
    scores[2, 3] = float("-inf")
    with pytest.raises(ValueError, match="row 2") as err:
        ranks_from_scores(scores, targets)
    assert "-inf" in str(err.value) and "\n" not in str(err.value)


def test_neg_inf_elsewhere_is_allowed_and_never_ranks_above():
    scores = torch.full((3, 10), float("-inf"))
    targets = torch.tensor([0, 4, 9])
    # targets with the lowest finite scores there are; everything else masked
    scores[0, 0] = -3.0e38
    scores[1, 4] = torch.finfo(torch.float32).min
    scores[2, 9] = -1.0
    scores[2, 2] = -1.0  # one genuine tie at row 2 -> counts against the target
    assert ranks_from_scores(scores, targets).tolist() == [1, 1, 2]


def test_bad_shapes_raise():
    with pytest.raises(ValueError):
        ranks_from_scores(torch.zeros(3), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError):
        ranks_from_scores(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="outside"):
        ranks_from_scores(torch.zeros(2, 4), torch.tensor([0, 4]))
    with pytest.raises(ValueError):
        ranks_from_scores(torch.zeros(2, 4), torch.tensor([0.0, 1.0]))
    assert ranks_from_scores(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)).shape == (0,)


def test_invariant_to_candidate_order_and_chunking():
    g = torch.Generator().manual_seed(3)
    n_users, n_cand = 257, 50
    scores = torch.randint(0, 6, (n_users, n_cand), generator=g).float()  # ties on purpose
    scores[torch.rand(n_users, n_cand, generator=g) < 0.1] = float("-inf")
    targets = torch.randint(0, n_cand, (n_users,), generator=g)
    scores[torch.arange(n_users), targets] = 2.0
    ranks = ranks_from_scores(scores, targets)

    perm = torch.randperm(n_cand, generator=g)  # new column j holds old column perm[j]
    inv = torch.argsort(perm)
    ranks_perm = ranks_from_scores(scores[:, perm], inv[targets])
    assert torch.equal(ranks, ranks_perm)

    for chunk in (1, 7, 64, 256, 1000):
        parts = [ranks_from_scores(scores[i : i + chunk], targets[i : i + chunk]) for i in range(0, n_users, chunk)]
        assert torch.equal(torch.cat(parts), ranks)
    assert summarize(ranks.numpy()) == summarize(ranks_perm.numpy())


def test_hit_rate_and_ndcg_never_decrease_in_k():
    rng = np.random.default_rng(4)
    ranks = rng.integers(1, 80, size=5000)
    hr = [hit_rate(ranks, k).mean() for k in range(1, 51)]
    nd = [ndcg(ranks, k).mean() for k in range(1, 51)]
    assert all(a <= b for a, b in itertools.pairwise(hr))
    assert all(a <= b for a, b in itertools.pairwise(nd))
    assert hr[0] < hr[-1]  # not trivially constant
    # per user too
    per_user = np.stack([hit_rate(ranks, k) for k in range(1, 51)])
    assert np.all(np.diff(per_user, axis=0) >= 0)


def test_check_k():
    check_k([5, 10, 20], 40)
    check_k([40], 40)
    with pytest.raises(ValueError) as err:
        check_k([10, 50], 40)
    assert str(err.value) == "eval.ks contains K=50 but the dataset has only 40 items; use K <= 40"
    with pytest.raises(ValueError, match="K=0"):
        check_k([0, 5], 40)


# ------------------------------------------------------------------------------------------
# item-frequency bins
# ------------------------------------------------------------------------------------------
def _five_core_counts(seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tail = rng.zipf(1.6, size=3000) + 6
    items = np.concatenate([np.full(4000, 4), np.full(2500, 6), np.full(800, 5), tail])
    rng.shuffle(items)
    return np.concatenate([[123], items]).astype(np.int64)  # [0] = padding, ignored


@pytest.mark.parametrize("mode", BIN_MODES)
def test_bins_are_count_thresholds(mode):
    counts = _five_core_counts()
    bins = item_freq_bins(counts, 5, mode)
    assert [b["bin"] for b in bins] == ["Q0", "Q1", "Q2", "Q3", "Q4"]
    assert all(b["n_items"] > 0 for b in bins)  # many distinct counts -> no empty bin
    idx = assign_item_bins(counts[1:], bins)
    assert idx.dtype == np.int64
    for value in (4, 5, 6):  # thousands of tied items: one bin each
        assert len(np.unique(idx[counts[1:] == value])) == 1
    # Q0 rarest: ranges are disjoint and increasing
    for a, b in itertools.pairwise(bins):
        assert a["lo"] <= a["hi"] < b["lo"] <= b["hi"]
    assert bins[0]["lo"] == counts[1:].min() and bins[-1]["hi"] == counts[1:].max()
    # n_items, shares agree with the assignment
    items = counts[1:]
    for i, b in enumerate(bins):
        in_bin = idx == i
        assert b["n_items"] == int(in_bin.sum())
        assert items[in_bin].min() == b["lo"] and items[in_bin].max() == b["hi"]
        assert b["share_items"] == pytest.approx(in_bin.mean())
        assert b["share_interactions"] == pytest.approx(items[in_bin].sum() / items.sum())
    assert sum(b["n_items"] for b in bins) == len(items)
    json.dumps(bins, allow_nan=False)


def test_equal_items_roughly_equal_when_possible():
    rng = np.random.default_rng(6)
    items = rng.integers(1, 400, size=10_000)  # many distinct counts, few ties each
    bins = item_freq_bins(np.concatenate([[0], items]), 5, "equal_items")
    shares = [b["share_items"] for b in bins]
    assert max(abs(s - 0.2) for s in shares) < 0.01


def test_equal_interactions_roughly_equal_mass():
    rng = np.random.default_rng(7)
    items = rng.integers(1, 400, size=10_000)
    bins = item_freq_bins(np.concatenate([[0], items]), 5, "equal_interactions")
    mass = [b["share_interactions"] for b in bins]
    assert max(abs(m - 0.2) for m in mass) < 0.01
    # equal mass means the rare bins hold many more items than the popular ones
    assert bins[0]["n_items"] > 2 * bins[-1]["n_items"]


@pytest.mark.parametrize("mode", BIN_MODES)
def test_bins_minimise_quantile_deviation(mode):
    """Brute force over all cut choices on small inputs: the thresholds are the closest to the
    ideal quantiles (sum of absolute deviations) among those that leave no bin empty."""
    rng = np.random.default_rng(8)
    for _ in range(30):
        items = rng.choice(rng.integers(0, 30, size=9), size=rng.integers(6, 40))
        counts = np.concatenate([[0], items])
        values, n_per = np.unique(items, return_counts=True)
        weights = n_per if mode == "equal_items" else values * n_per
        cum = np.concatenate([[0], np.cumsum(weights)])
        m, n = len(values), 4
        bins = item_freq_bins(counts, n, mode)
        if m < n:
            assert sum(b["n_items"] > 0 for b in bins) == m
            continue
        got_cuts = [int(np.searchsorted(values, b["lo"])) for b in bins[1:]]
        targets = [(b + 1) * cum[-1] for b in range(n - 1)]  # ideal quantiles, scaled by n

        def cost(cuts, cum=cum, targets=targets, n=n):
            return sum(abs(n * cum[c] - t) for c, t in zip(cuts, targets))

        best = min(cost(c) for c in itertools.combinations(range(1, m), n - 1))
        assert cost(got_cuts) == best


def test_zero_count_items_go_to_q0():
    items = np.concatenate([np.zeros(30), np.arange(1, 200)]).astype(np.int64)
    for mode in BIN_MODES:
        bins = item_freq_bins(np.concatenate([[0], items]), 5, mode)
        assert bins[0]["lo"] == 0
        assert np.all(assign_item_bins(np.zeros(3, dtype=np.int64), bins) == 0)


def test_fewer_distinct_counts_than_bins_keeps_n_bins_entries():
    counts = np.array([0, 4, 4, 6, 6, 9])
    bins = item_freq_bins(counts, 5)
    assert len(bins) == 5
    assert [b["n_items"] for b in bins] == [2, 0, 2, 0, 1]
    assert [(b["lo"], b["hi"]) for b in bins] == [
        (4, 4),
        (None, None),
        (6, 6),
        (None, None),
        (9, 9),
    ]
    assert bins[1]["share_items"] == 0.0
    assert assign_item_bins(np.array([4, 6, 9, 5, 100, 0]), bins).tolist() == [0, 2, 4, 0, 4, 0]
    single = item_freq_bins(np.array([0, 3, 3, 3]), 5)
    assert [b["n_items"] for b in single] == [3, 0, 0, 0, 0]
    json.dumps(bins, allow_nan=False)


def test_bins_bad_input():
    with pytest.raises(ValueError) as err:
        item_freq_bins(np.array([0, 1, 2]), 5, "quantile")
    msg = str(err.value)
    assert "\n" not in msg and all(mode in msg for mode in BIN_MODES)
    with pytest.raises(ValueError):
        item_freq_bins(np.array([0, 1, 2]), 0)
    with pytest.raises(ValueError):
        item_freq_bins(np.array([0, -1, 2]), 2)


# ------------------------------------------------------------------------------------------
# cold users
# ------------------------------------------------------------------------------------------
def test_cold_threshold_worked_example():
    # sorted lengths: <=2 covers 1/10, <=3 covers 4/10 -> smallest reaching 0.2 is 3 (share 0.4)
    h = np.array([9, 3, 12, 2, 3, 8, 10, 5, 3, 9])
    assert cold_threshold(h, 0.2) == 3
    assert cold_threshold(h, 0.1) == 2  # exactly reached
    assert cold_threshold(h, 0.41) == 5
    assert cold_threshold(h, 1.0) == 12
    assert cold_threshold(np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), 0.7) == 6  # no float slip
    assert type(cold_threshold(h)) is int


def test_cold_threshold_keeps_ties_and_reaches_share():
    rng = np.random.default_rng(9)
    for share in (0.05, 0.2, 0.33, 0.5):
        h = rng.geometric(0.15, size=3000) + 1  # lots of ties
        thr = cold_threshold(h, share)
        cold_share = np.mean(h <= thr)
        assert cold_share >= share
        below = h[h < thr]
        assert below.size / h.size < share  # thr is the smallest such length
        assert np.all(h[h == thr] <= thr)  # trivially: the whole tie group is cold
    with pytest.raises(ValueError):
        cold_threshold(np.array([], dtype=np.int64))
    with pytest.raises(ValueError):
        cold_threshold(np.array([1, 2]), 0.0)


# ------------------------------------------------------------------------------------------
# strata
# ------------------------------------------------------------------------------------------
def _rank_table(seed: int = 10, n_users: int = 3000):
    rng = np.random.default_rng(seed)
    counts = _five_core_counts(seed)
    n_items = len(counts) - 1
    # half uniform, half popularity-weighted targets, so every frequency bin has test users
    pop = counts[1:] / counts[1:].sum()
    popular = rng.choice(np.arange(1, n_items + 1), size=n_users // 2, p=pop)
    targets = np.concatenate([rng.integers(1, n_items + 1, size=n_users - n_users // 2), popular])
    table = pd.DataFrame(
        {
            "user": rng.permutation(n_users) + 1,
            "target": targets,
            "rank": rng.integers(1, 60, size=n_users),
            "history_len": rng.geometric(0.2, size=n_users) + 1,
            "target_count": counts[targets],
        }
    )
    return table, counts


def _weighted(blocks, key):
    n = sum(b["n_users"] for b in blocks)
    return sum(b[key] * b["n_users"] for b in blocks if b["n_users"]) / n


@pytest.mark.parametrize("mode", BIN_MODES)
def test_strata_recombine_to_overall(mode):
    table, counts = _rank_table()
    ks = (5, 10, 20)
    out = stratify(table, counts, n_bins=5, bin_mode=mode, ks=ks)
    overall = out["overall"]
    assert overall == summarize(table["rank"].to_numpy(), ks)
    keys = [k for k in overall if k != "n_users"]
    bins = out["by_item_freq"]
    assert len(bins) == 5 and sum(b["n_users"] for b in bins) == len(table)
    assert sum(b["share_users"] for b in bins) == pytest.approx(1.0)
    groups = out["cold_users"], out["warm_users"]
    assert sum(g["n_users"] for g in groups) == len(table)
    for key in keys:
        assert _weighted(bins, key) == pytest.approx(overall[key], rel=1e-12)
        assert _weighted(groups, key) == pytest.approx(overall[key], rel=1e-12)
    # each bin is exactly the users whose target count falls in its range
    assert all(b["n_users"] > 0 for b in bins)
    for b in bins:
        in_bin = table["target_count"].between(b["lo"], b["hi"])
        assert b["n_users"] == int(in_bin.sum())
        assert b["HR@10"] == pytest.approx((table.loc[in_bin, "rank"] <= 10).mean())
    thr = cold_threshold(table["history_len"].to_numpy())
    assert out["cold_users"]["max_history"] == thr
    assert out["cold_users"]["share_users"] == pytest.approx((table["history_len"] <= thr).mean())
    assert out["cold_users"]["share_users"] >= 0.2
    assert out["item_freq_bins"] == {"mode": mode, "n_bins": 5}
    json.dumps(out, allow_nan=False)


def test_stratify_empty_strata_are_null_and_explicit_threshold():
    table, counts = _rank_table(n_users=50)
    out = stratify(table, counts, cold_max_history=10_000, ks=(10,))
    assert out["cold_users"]["n_users"] == 50 and out["cold_users"]["max_history"] == 10_000
    warm = out["warm_users"]
    assert warm["n_users"] == 0 and warm["share_users"] == 0.0
    assert warm["HR@10"] is None and warm["NDCG@10"] is None and warm["MRR"] is None
    # bins that exist but hold no test user
    tiny = pd.DataFrame(
        {
            "user": [1, 2],
            "target": [1, 2],
            "rank": [1, 3],
            "history_len": [2, 5],
            "target_count": [counts[1], counts[2]],
        }
    )
    out = stratify(tiny, counts, ks=(10,))
    empty = [b for b in out["by_item_freq"] if b["n_users"] == 0]
    assert empty and all(b["HR@10"] is None and b["MRR"] is None for b in empty)
    text = json.dumps(out, allow_nan=False)
    assert "NaN" not in text


def test_stratify_rejects_inconsistent_tables():
    table, counts = _rank_table(n_users=20)
    bad = table.copy()
    bad.loc[0, "target_count"] += 1
    with pytest.raises(ValueError, match="target_count"):
        stratify(bad, counts)
    dup = pd.concat([table, table.iloc[:1]])
    with pytest.raises(ValueError, match="more than once"):
        stratify(dup, counts)
    with pytest.raises(ValueError, match="lacks column"):
        stratify(table.drop(columns="history_len"), counts)
