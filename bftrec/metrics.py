"""Ranking metrics: pure functions over per-user ranks, and the strata computed from them.

This module implements the metric part of DESIGN.md, section "Evaluation protocol":

* **Ranks** come from :func:`ranks_from_scores`. Ties are **pessimistic**:
  ``rank = 1 + #{other candidates c != target with score_c >= score_target}``, so a model that gives
  every item the same score gets HR@10 = 0 and a model with random scores gets about 10/N.
  A non-finite score is an error, never a rank. Masked candidates carry ``-inf`` and can never
  reach the target's (finite) score.
* **Metrics** (one relevant item per user, ``rank`` in 1..C):

  - ``HR@K   = 1[rank <= K]``;
  - ``NDCG@K = 1 / log2(rank + 1)`` if ``rank <= K`` else 0 (the ideal DCG of a single relevant
    item is 1, so DCG = NDCG);
  - ``MRR    = mean(1 / rank)`` over the full list (no cutoff).

  Every reported figure is a plain mean over users.
* **Strata** (:func:`stratify`) are aggregations of one per-user rank table, never separate
  passes, so the user-weighted mean of the strata equals the overall figure:

  - item frequency: the target's training count, split into ``n_bins`` bins by **count thresholds**
    (:func:`item_freq_bins`), Q0 = rarest;
  - cold users: ``history_len <= max_history`` (:func:`cold_threshold` gives the default).

Everything returned by :func:`summarize`, :func:`item_freq_bins` and :func:`stratify` is
JSON-serialisable (python ``int``/``float``/``str``/``None``; an undefined mean is ``None``, never
NaN). The metrics are independent of batch size, candidate order and chunking: they only see ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

__all__ = [
    "BIN_MODES",
    "RANK_TABLE_COLUMNS",
    "assign_item_bins",
    "check_k",
    "cold_threshold",
    "hit_rate",
    "item_freq_bins",
    "ndcg",
    "ranks_from_scores",
    "reciprocal_rank",
    "stratify",
    "summarize",
]

BIN_MODES = ("equal_items", "equal_interactions")
"""Accepted values of ``mode`` in :func:`item_freq_bins` (``eval`` config: the bin mode)."""

RANK_TABLE_COLUMNS = ("user", "target", "rank", "history_len", "target_count")
"""Columns of the per-user rank table (``ranks.csv.gz``) that :func:`stratify` reads."""


# --------------------------------------------------------------------------------------------
# scores -> ranks
# --------------------------------------------------------------------------------------------
def ranks_from_scores(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Pessimistic 1-based rank of each row's target among that row's candidates.

    DESIGN.md, "Evaluation protocol": ``rank = 1 + #{c != target : score_c >= score_target}``.
    Equal scores count *against* the target, so constant scores give rank C (HR@10 = 0 when C > 10).

    Args:
        scores: ``(B, C)`` floating tensor of candidate scores. Candidates excluded from ranking
            (padding, special ids, history items) must already be ``-inf``; they never count.
        targets: ``(B,)`` integer tensor (int64): the column index in ``[0, C)`` of each row's
            target.

    Returns:
        ``(B,)`` int64 tensor on ``scores.device``, values in ``1..C``; 1 = best.

    Raises:
        ValueError (one line, naming the row and the value): ``scores`` contains NaN or ``+inf``
        anywhere; a target's score is not finite (e.g. ``-inf`` because it was masked); the
        shapes/dtypes are wrong; a target index is outside ``[0, C)``.
        TypeError: ``scores`` or ``targets`` is not a ``torch.Tensor``.

    The comparison is done in the dtype of ``scores``: lower-precision scores (bf16) tie more often,
    and those ties are counted pessimistically like any other.
    """
    if not isinstance(scores, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("ranks_from_scores expects torch tensors for scores and targets")
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (B, C); got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a floating tensor; got dtype {scores.dtype}")
    n_rows, n_cand = scores.shape
    if targets.dim() != 1 or targets.shape[0] != n_rows:
        raise ValueError(
            f"targets must have shape ({n_rows},) to match scores {tuple(scores.shape)}; got {tuple(targets.shape)}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor; got dtype {targets.dtype}")
    if n_rows == 0:
        return torch.zeros(0, dtype=torch.int64, device=scores.device)
    targets = targets.to(device=scores.device, dtype=torch.int64)
    out_of_range = (targets < 0) | (targets >= n_cand)
    if bool(out_of_range.any()):
        row = int(out_of_range.nonzero()[0, 0])
        raise ValueError(f"target index {int(targets[row])} at row {row} is outside [0, {n_cand}) candidates")

    # NaN and +inf in one pass: both fail `x < +inf`.
    bad = ~(scores < float("inf"))
    if bool(bad.any()):
        row, col = (int(v) for v in bad.nonzero()[0])
        value = float(scores[row, col])
        raise ValueError(
            f"non-finite score {value} at row {row}, column {col}; a non-finite score is an error, "
            "never a rank (DESIGN.md, Evaluation protocol)"
        )
    target_scores = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
    bad_target = ~torch.isfinite(target_scores.squeeze(1))
    if bool(bad_target.any()):
        row = int(bad_target.nonzero()[0, 0])
        raise ValueError(
            f"target score {float(target_scores[row, 0])} at row {row} "
            f"(column {int(targets[row])}) is not finite; "
            "was the target masked out of the candidates?"
        )
    # The target itself satisfies `>=` (its score is finite), which supplies the "1 +".
    return (scores >= target_scores).sum(dim=1, dtype=torch.int64)


# --------------------------------------------------------------------------------------------
# per-user metrics
# --------------------------------------------------------------------------------------------
def _as_ranks(ranks) -> np.ndarray:
    """1-D int64 numpy copy of ``ranks`` (numpy, list, pandas or torch); every rank must be >= 1."""
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.detach().cpu().numpy()
    arr = np.asarray(ranks)
    if arr.ndim != 1:
        raise ValueError(f"ranks must be 1-D (one rank per user); got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"ranks must be numeric; got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
        raise ValueError("ranks must be whole numbers >= 1; got non-integer or non-finite values")
    arr = arr.astype(np.int64)
    if arr.min() < 1:
        raise ValueError(f"ranks must be >= 1 (1 = best); got minimum {int(arr.min())}")
    return arr


def _check_k_value(k) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"K must be an integer >= 1; got {k!r}")
    if k < 1:
        raise ValueError(f"K must be an integer >= 1; got K={int(k)}")
    return int(k)


def hit_rate(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per-user hit: ``HR@K = 1[rank <= K]`` (DESIGN.md, "Evaluation protocol").

    Args:
        ranks: ``(U,)`` integer ranks, 1 = best (numpy, list or torch).
        k: cutoff, integer >= 1.

    Returns:
        ``(U,)`` float64 array of 0.0/1.0; its mean is HR@K.

    Raises:
        ValueError: ``k < 1``; ranks not 1-D whole numbers >= 1.
        TypeError: ``k`` is not an integer.
    """
    k = _check_k_value(k)
    return (_as_ranks(ranks) <= k).astype(np.float64)


def ndcg(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per-user NDCG@K with one relevant item: ``1 / log2(rank + 1)`` if ``rank <= K`` else 0.

    With a single relevant item the ideal DCG is 1, so NDCG equals DCG (DESIGN.md, "Evaluation
    protocol"). Rank 1 gives 1.0, rank 3 gives 0.5.

    Args:
        ranks: ``(U,)`` integer ranks, 1 = best.
        k: cutoff, integer >= 1.

    Returns:
        ``(U,)`` float64 array in ``[0, 1]``; its mean is NDCG@K.

    Raises:
        ValueError: ``k < 1``; ranks not 1-D whole numbers >= 1.
        TypeError: ``k`` is not an integer.
    """
    k = _check_k_value(k)
    r = _as_ranks(ranks)
    out = np.zeros(r.shape, dtype=np.float64)
    hit = r <= k
    out[hit] = 1.0 / np.log2(r[hit].astype(np.float64) + 1.0)
    return out


def reciprocal_rank(ranks) -> np.ndarray:
    """Per-user reciprocal rank ``1 / rank``, over the full list (no cutoff); MRR is its mean.

    Args:
        ranks: ``(U,)`` integer ranks, 1 = best.

    Returns:
        ``(U,)`` float64 array in ``(0, 1]``.

    Raises:
        ValueError: ranks not 1-D whole numbers >= 1.
    """
    return 1.0 / _as_ranks(ranks).astype(np.float64)


def _per_user_metrics(ranks: np.ndarray, ks: Sequence[int]) -> dict[str, np.ndarray]:
    per_user: dict[str, np.ndarray] = {}
    for k in ks:
        per_user[f"HR@{k}"] = hit_rate(ranks, k)
        per_user[f"NDCG@{k}"] = ndcg(ranks, k)
    per_user["MRR"] = reciprocal_rank(ranks)
    return per_user


def _mean_block(per_user: dict[str, np.ndarray], mask: np.ndarray | None = None) -> dict:
    """User means of the per-user metrics (over ``mask`` if given), ``n_users``; None if empty."""
    n = int(next(iter(per_user.values())).shape[0] if mask is None else np.count_nonzero(mask))
    out: dict = {}
    for key, values in per_user.items():
        sel = values if mask is None else values[mask]
        out[key] = float(sel.mean()) if n > 0 else None
    out["n_users"] = n
    return out


def _normalise_ks(ks: Iterable[int]) -> list[int]:
    seen: list[int] = []
    for k in ks:
        k = _check_k_value(k)
        if k not in seen:
            seen.append(k)
    return seen


def summarize(ranks: np.ndarray, ks: Sequence[int] = (5, 10, 20)) -> dict[str, float]:
    """User means of HR@K and NDCG@K for each K in ``ks``, MRR, and the number of users.

    DESIGN.md, "Evaluation protocol": HR@K, NDCG@K (K in {5, 10, 20}) and MRR; the headline
    numbers are HR@10 and NDCG@10.

    Args:
        ranks: ``(U,)`` integer ranks, 1 = best.
        ks: cutoffs, each an integer >= 1 (duplicates are dropped, order kept).

    Returns:
        ``{"HR@5": float, "NDCG@5": float, ..., "MRR": float, "n_users": int}`` in that key order,
        python scalars. With no users every metric is ``None`` (JSON null) and ``n_users`` is 0.

    Raises:
        ValueError: a K < 1; ranks not 1-D whole numbers >= 1.
        TypeError: a K is not an integer.
    """
    ks = _normalise_ks(ks)
    r = _as_ranks(ranks)
    return _mean_block(_per_user_metrics(r, ks))


def check_k(ks: Iterable[int], n_candidates: int) -> None:
    """Fail early on a meaningless cutoff: every K must satisfy ``1 <= K <= n_candidates``.

    Args:
        ks: the configured cutoffs (``eval.ks``).
        n_candidates: number of rankable items N of the dataset.

    Raises:
        ValueError (one line), e.g. ``"eval.ks contains K=50 but the dataset has only 40 items;
        use K <= 40"``, or for a K that is not an integer >= 1.
    """
    n = int(n_candidates)
    for k in ks:
        try:
            k = _check_k_value(k)
        except (TypeError, ValueError):
            raise ValueError(f"eval.ks contains K={k!r}; every K must be an integer >= 1") from None
        if k > n:
            raise ValueError(f"eval.ks contains K={k} but the dataset has only {n} items; use K <= {n}")


# --------------------------------------------------------------------------------------------
# item-frequency bins
# --------------------------------------------------------------------------------------------
def _as_counts(counts, name: str) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {arr.shape}")
    whole_floats = arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
    if arr.size and arr.dtype.kind not in "iu" and not whole_floats:
        raise ValueError(f"{name} must hold non-negative integers; got dtype {arr.dtype}")
    return arr.astype(np.int64)


_INF = np.iinfo(np.int64).max // 4


def _choose_cuts(cum: np.ndarray, total: int, n_bins: int) -> list[int]:
    """Boundary indices ``i_1 <= ... <= i_{n_bins-1}`` into the ``m`` sorted distinct counts.

    ``cum[i]`` (``i = 0..m``) is the weight of the distinct counts below the ``i``-th one; bin ``b``
    holds distinct counts ``i_b <= j < i_{b+1}`` (``i_0 = 0``, ``i_n = m``). The cuts minimise
    ``sum_b |cum[i_b] - b * total / n_bins|`` (exactly, in integers), subject to:

    * ``m >= n_bins``: strictly increasing cuts in ``[1, m-1]``, so every bin is non-empty;
    * ``2 <= m < n_bins``: every boundary ``1..m-1`` is used (each distinct count its own bin), cuts
      step by 0 or 1; repeated cuts are the empty bins, placed where the ideal quantiles crowd.
      Q0 and Q{n-1} are never empty.
    """
    m = cum.shape[0] - 1
    n = n_bins
    if n == 1 or m <= 1:
        return [m] * (n - 1)  # everything in Q0
    inner = cum[1:m].astype(np.int64)  # boundary i = 1..m-1 at position i-1
    n_pos = m - 1
    strict = m >= n
    dp = np.full(n_pos, _INF, dtype=np.int64)
    back = np.zeros((n, n_pos), dtype=np.int64)
    for b in range(1, n):
        cost = np.abs(n * inner - b * total)
        if b == 1:
            new = cost.copy()
            if not strict:
                new[1:] = _INF
        elif strict:
            # best predecessor strictly before each position: shifted prefix minimum
            # (earliest argmin on ties).
            before = np.concatenate(([_INF], dp[:-1]))  # dp at position p-1, for each p
            best_val = np.minimum.accumulate(before)
            prev_best = np.concatenate(([_INF + 1], best_val[:-1]))
            improves = before < prev_best
            best_arg = np.maximum.accumulate(np.where(improves, np.arange(n_pos) - 1, -1))
            best_arg = np.maximum(best_arg, 0)
            new = np.where(best_val >= _INF, _INF, best_val + cost)
            back[b] = best_arg
        else:
            stay = dp
            step = np.concatenate(([_INF], dp[:-1]))
            use_step = step < stay
            best_val = np.where(use_step, step, stay)
            back[b] = np.arange(n_pos) - use_step.astype(np.int64)
            new = np.where(best_val >= _INF, _INF, best_val + cost)
        dp = np.minimum(new, _INF)
    end = int(np.argmin(dp)) if strict else n_pos - 1
    pos = [end]
    for b in range(n - 1, 1, -1):
        pos.append(int(back[b][pos[-1]]))
    return [p + 1 for p in reversed(pos)]


def item_freq_bins(train_counts: np.ndarray, n_bins: int = 5, mode: str = "equal_items") -> list[dict]:
    """Split items into ``n_bins`` frequency bins by **count thresholds**, Q0 = rarest.

    DESIGN.md, "Evaluation protocol", strata: item frequency is the training count; items with
    equal counts always share a bin (this matters on 5-core data, where thousands of items have
    count 4 or 6), so bins are ranges of the count, not ranks of items.

    Thresholds: the distinct counts, ascending, are cut into ``n_bins`` contiguous groups. The cut
    points are the boundaries between distinct counts whose cumulative weight is closest (in total
    absolute deviation, computed exactly) to the ideal quantiles ``b / n_bins``, where the weight of
    an item is 1 (``"equal_items"``: bins hold about equal numbers of items) or its count
    (``"equal_interactions"``: about equal numbers of training interactions). With at least
    ``n_bins`` distinct counts every bin is non-empty.

    Fewer distinct counts than bins: all ``n_bins`` entries are still returned so tables align;
    each distinct count gets its own bin, Q0 holds the smallest and Q{n_bins-1} the largest, and the
    bins in between that stay empty have ``n_items`` 0, shares 0.0 and ``lo``/``hi`` ``None``.
    A single distinct count puts every item into Q0.

    Items with count 0 (never in training) have the smallest count, so they are in Q0.

    Args:
        train_counts: ``(N+1,)`` integer (int64) training-interaction count per item id; index 0 is
            padding and is ignored. Counts must come from training interactions only.
        n_bins: number of bins, >= 1.
        mode: one of :data:`BIN_MODES`.

    Returns:
        ``n_bins`` dicts, in order Q0..Q{n_bins-1}: ``{"bin": "Q0", "lo": int | None,
        "hi": int | None, "n_items": int, "share_items": float,
        "share_interactions": float | None}``, where ``[lo, hi]`` is the inclusive range of the
        counts present in the bin (``lo``/``hi`` increase across non-empty bins) and
        ``share_interactions`` is ``None`` if there are no training interactions at all.

    Raises:
        ValueError (one line): unknown ``mode`` (the message lists the modes), ``n_bins`` not an
        integer >= 1, no item besides padding, or negative / non-integer counts.
    """
    if mode not in BIN_MODES:
        raise ValueError(f"unknown item-frequency bin mode {mode!r}; known: {', '.join(BIN_MODES)}")
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1; got {n_bins!r}")
    n_bins = int(n_bins)
    counts = _as_counts(train_counts, "train_counts")
    if counts.shape[0] < 2:
        raise ValueError(f"train_counts must have length N+1 >= 2 (index 0 = padding); got {counts.shape[0]}")
    items = counts[1:]
    if items.min() < 0:
        raise ValueError(f"train_counts must be >= 0; got minimum {int(items.min())}")

    values, n_per_value = np.unique(items, return_counts=True)  # ascending distinct counts
    mass_per_value = values * n_per_value
    weights = n_per_value if mode == "equal_items" else mass_per_value
    cum = np.concatenate(([0], np.cumsum(weights))).astype(np.int64)
    cuts = _choose_cuts(cum, int(cum[-1]), n_bins)
    edges = [0, *cuts, values.shape[0]]

    n_items_total = int(items.shape[0])
    mass_total = int(mass_per_value.sum())
    bins: list[dict] = []
    for b in range(n_bins):
        lo_i, hi_i = edges[b], edges[b + 1]
        n_items = int(n_per_value[lo_i:hi_i].sum())
        mass = int(mass_per_value[lo_i:hi_i].sum())
        empty = hi_i <= lo_i
        bins.append(
            {
                "bin": f"Q{b}",
                "lo": None if empty else int(values[lo_i]),
                "hi": None if empty else int(values[hi_i - 1]),
                "n_items": n_items,
                "share_items": n_items / n_items_total,
                "share_interactions": (mass / mass_total) if mass_total > 0 else None,
            }
        )
    return bins


def assign_item_bins(counts: np.ndarray, bins: list[dict]) -> np.ndarray:
    """Bin index (position in ``bins``) for each count, using the bins' ``lo`` thresholds.

    A count goes to the last non-empty bin whose ``lo`` is <= the count. Counts below Q0's ``lo``
    (e.g. 0) go to the first non-empty bin (Q0); counts between one bin's ``hi`` and the next
    bin's ``lo`` (absent from the counts the bins were built from) go to the lower bin; counts
    above the last ``hi`` go to the last non-empty bin.

    Args:
        counts: ``(U,)`` non-negative integer counts, e.g. ``train_counts[targets]``.
        bins: output of :func:`item_freq_bins`.

    Returns:
        ``(U,)`` int64 array of indices into ``bins``.

    Raises:
        ValueError: negative / non-integer counts, no non-empty bin, or ``lo`` not increasing.
    """
    c = _as_counts(counts, "counts")
    if c.size and c.min() < 0:
        raise ValueError(f"counts must be >= 0; got minimum {int(c.min())}")
    nonempty = [i for i, b in enumerate(bins) if b.get("n_items", 0) > 0 and b["lo"] is not None]
    if not nonempty:
        raise ValueError("bins has no non-empty bin; build it with item_freq_bins()")
    los = np.array([bins[i]["lo"] for i in nonempty], dtype=np.int64)
    if np.any(np.diff(los) <= 0):
        raise ValueError(f"bin lower bounds must increase across bins; got {los.tolist()}")
    pos = np.searchsorted(los, c, side="right") - 1
    pos = np.clip(pos, 0, len(nonempty) - 1)
    return np.asarray(nonempty, dtype=np.int64)[pos]


# --------------------------------------------------------------------------------------------
# cold users
# --------------------------------------------------------------------------------------------
def cold_threshold(history_len: np.ndarray, share: float = 0.2) -> int:
    """Default ``eval.cold_user_max_history``: smallest length with cumulative user share >= share.

    DESIGN.md, "Evaluation protocol": history length = number of interactions before the test
    target; a user is cold if that length is at most the threshold. Ties are kept together, so
    every user with the threshold length is cold and the actual cold share can exceed ``share``;
    record it.

    Example: lengths ``[2, 3, 3, 3, 5, 8, 9, 9, 10, 12]``, share 0.2: ``<= 2`` covers 10% and
    ``<= 3`` covers 40%, so the threshold is 3 and the cold share 0.4.

    Args:
        history_len: ``(U,)`` non-negative integers, one per test user.
        share: target cold share, ``0 < share <= 1``.

    Returns:
        the threshold as a python ``int``.

    Raises:
        ValueError: empty input, negative / non-integer lengths, or ``share`` outside ``(0, 1]``.
    """
    if not (0.0 < float(share) <= 1.0):
        raise ValueError(f"cold share must be in (0, 1]; got {share!r}")
    h = _as_counts(history_len, "history_len")
    if h.size == 0:
        raise ValueError("history_len is empty; no users to derive a cold threshold from")
    if h.min() < 0:
        raise ValueError(f"history_len must be >= 0; got minimum {int(h.min())}")
    values, n_per_value = np.unique(h, return_counts=True)
    cum_share = np.cumsum(n_per_value) / h.shape[0]  # exact rationals compare safely with `share`
    idx = int(np.argmax(cum_share >= float(share)))  # the last entry is 1.0 >= share
    return int(values[idx])


# --------------------------------------------------------------------------------------------
# strata
# --------------------------------------------------------------------------------------------
def stratify(
    rank_table: pd.DataFrame,
    train_counts: np.ndarray,
    n_bins: int = 5,
    bin_mode: str = "equal_items",
    cold_max_history: int | None = None,
    ks: Sequence[int] = (5, 10, 20),
) -> dict:
    """Overall metrics and the item-frequency and cold/warm strata of one per-user rank table.

    DESIGN.md, "Evaluation protocol", strata: they are aggregations of this one table, never
    separate passes, so the user-weighted mean of the strata
    (``sum(n_users * metric) / sum(n_users)``) equals the overall figure, both over the
    item-frequency bins and over cold + warm.

    Args:
        rank_table: one row per test user with columns :data:`RANK_TABLE_COLUMNS`: ``user``,
            ``target`` (item id), ``rank`` (int >= 1), ``history_len`` (interactions before the
            target), ``target_count`` (= ``train_counts[target]``). Users must be unique.
        train_counts: ``(N+1,)`` int64 training counts per item id, index 0 = padding.
        n_bins, bin_mode: passed to :func:`item_freq_bins`.
        cold_max_history: a user is cold if ``history_len <= cold_max_history``; ``None`` uses
            :func:`cold_threshold` with share 0.2.
        ks: cutoffs for :func:`summarize`.

    Returns:
        ``{"overall": summarize(...),
        "by_item_freq": [{"bin", "lo", "hi", "n_items", "share_items", "share_interactions",
        "n_users", "share_users", "HR@5", "NDCG@5", ..., "MRR"}, ...]`` (``n_bins`` entries),
        ``"cold_users": {"max_history", "n_users", "share_users", "HR@5", ..., "MRR"}``,
        ``"warm_users"``: same keys, ``"item_freq_bins": {"mode": bin_mode, "n_bins": n_bins}}``.
        Metrics of an empty stratum are ``None`` (JSON null), never NaN; all values are python
        scalars.

    Raises:
        ValueError (one line): missing columns, empty table, duplicate users, a target outside
        ``1..N``, ``target_count`` disagreeing with ``train_counts[target]``, invalid ranks, K < 1,
        unknown bin mode.
        TypeError: a K or ``cold_max_history`` that is not an integer.
    """
    missing = [c for c in RANK_TABLE_COLUMNS if c not in rank_table.columns]
    if missing:
        raise ValueError(f"rank_table lacks column(s) {', '.join(missing)}; expected {', '.join(RANK_TABLE_COLUMNS)}")
    if len(rank_table) == 0:
        raise ValueError("rank_table is empty; there are no users to stratify")
    if rank_table["user"].duplicated().any():
        dup = rank_table.loc[rank_table["user"].duplicated(), "user"].iloc[0]
        raise ValueError(f"rank_table has user {dup!r} more than once; each user is evaluated once")
    ks = _normalise_ks(ks)
    counts = _as_counts(train_counts, "train_counts")
    bins = item_freq_bins(counts, n_bins=n_bins, mode=bin_mode)

    ranks = _as_ranks(rank_table["rank"].to_numpy())
    targets = _as_counts(rank_table["target"].to_numpy(), "target")
    n_items = counts.shape[0] - 1
    if targets.min() < 1 or targets.max() > n_items:
        bad = targets[(targets < 1) | (targets > n_items)][0]
        raise ValueError(f"rank_table has target {int(bad)} outside the item ids 1..{n_items}")
    target_count = _as_counts(rank_table["target_count"].to_numpy(), "target_count")
    mismatch = target_count != counts[targets]
    if mismatch.any():
        i = int(np.argmax(mismatch))
        raise ValueError(
            f"target_count {int(target_count[i])} of target {int(targets[i])} differs from "
            f"train_counts[target] = {int(counts[targets[i]])}; "
            "were they computed on the same split?"
        )
    history = _as_counts(rank_table["history_len"].to_numpy(), "history_len")
    if history.min() < 0:
        raise ValueError(f"history_len must be >= 0; got minimum {int(history.min())}")

    per_user = _per_user_metrics(ranks, ks)
    n_users = int(ranks.shape[0])

    def block(mask: np.ndarray) -> dict:
        means = _mean_block(per_user, mask)
        n = means.pop("n_users")
        return {"n_users": n, "share_users": n / n_users, **means}

    user_bin = assign_item_bins(target_count, bins)
    by_item_freq = []
    for i, b in enumerate(bins):
        by_item_freq.append({**b, **block(user_bin == i)})

    if cold_max_history is None:
        thr = cold_threshold(history, share=0.2)
    else:
        thr = cold_max_history
        if isinstance(thr, bool) or not isinstance(thr, (int, np.integer)):
            raise TypeError(f"eval.cold_user_max_history must be an integer or null; got {thr!r}")
        thr = int(thr)
    cold = history <= thr
    return {
        "overall": _mean_block(per_user),
        "by_item_freq": by_item_freq,
        "cold_users": {"max_history": thr, **block(cold)},
        "warm_users": {"max_history": thr, **block(~cold)},
        "item_freq_bins": {"mode": bin_mode, "n_bins": int(n_bins)},
    }
