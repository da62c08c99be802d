"""Beyond-accuracy metrics of the recommended top-K lists (issue 48 item 2), per run and per stratum.

From each test user's top-K list (full ranking, history excluded, as scored; ``rank_users``' ``topk_sink``):

- ``coverage@K``: the share of the N catalogue items that appear in at least one list of the group;
- ``tail_share@K``: the share of list entries that are items of the two rarest item-frequency bins (Q0, Q1 of
  the test strata, by training count);
- ``popularity@K``: the mean training count of the listed items (interactions; higher = more popular lists);
- ``gini@K``: the Gini index of how often each catalogue item is recommended across the group's lists (0 =
  every item equally often, → 1 = a few items take every slot); items never listed count as 0.

Groups: ``overall``, the test strata's item-frequency bins of the **target** (``by_item_freq``) and cold/warm
users, as in ``metrics.test``. Sources: RecBole's ItemCoverage, TailPercentage, AveragePopularity and
GiniIndex (Zhao et al. 2021) define the same quantities.
"""
from __future__ import annotations

import numpy as np

from bftrec.metrics import assign_item_bins


def gini(counts: np.ndarray) -> float:
    """Gini index of non-negative counts (one per catalogue item): sum_i (2i − n − 1) c_(i) / (n · sum c),
    c sorted ascending, i = 1..n. 0 for equal counts; (n − 1)/n when one item takes everything."""
    c = np.sort(np.asarray(counts, dtype=np.float64))
    n, total = len(c), c.sum()
    if n == 0 or total == 0:
        return 0.0
    i = np.arange(1, n + 1)
    return float(((2 * i - n - 1) * c).sum() / (n * total))


def list_metrics(lists: np.ndarray, n_items: int, train_counts: np.ndarray, tail: np.ndarray, k: int) -> dict:
    """The four metrics of a group's top-K lists.

    Args: lists: (U, K') int64 item ids (1..N), K' >= k, best first; n_items: N; train_counts: (N + 1,) int64;
    tail: (N + 1,) bool, the items of the two rarest bins; k: the cut-off.
    Returns {"coverage@k", "tail_share@k", "popularity@k", "gini@k"} (None each for an empty group)."""
    top = np.asarray(lists)[:, :k]
    if top.size == 0:
        return {f"{m}@{k}": None for m in ("coverage", "tail_share", "popularity", "gini")}
    rec = np.bincount(top.ravel(), minlength=n_items + 1)[1:]  # (N,) times each item is recommended
    return {f"coverage@{k}": float((rec > 0).mean()), f"tail_share@{k}": float(tail[top].mean()),
            f"popularity@{k}": float(train_counts[top].mean()), f"gini@{k}": gini(rec)}


def beyond_accuracy(users: np.ndarray, lists: np.ndarray, table, test: dict, train_counts: np.ndarray,
                    n_items: int, k: int = 10) -> dict:
    """``metrics.json``'s ``beyond_accuracy`` block: ``list_metrics`` overall, per target bin and cold/warm.

    Args: users: (U,) int64 user of each list row; lists: (U, K') int64 top lists; table: the rank table
    (``user``, ``target_count``, ``history_len``); test: ``stratify``'s output (bins, cold threshold)."""
    bins = test["by_item_freq"]
    item_bin = assign_item_bins(np.asarray(train_counts), bins)  # (N + 1,) bin of every item
    tail = np.isin(item_bin, [0, 1])
    tail[0] = False
    order = np.argsort(users)
    users, lists = np.asarray(users)[order], np.asarray(lists)[order]
    t = table.set_index("user").loc[users]
    tgt_bin = assign_item_bins(t["target_count"].to_numpy(), bins)
    cold = t["history_len"].to_numpy() <= test["cold_users"]["max_history"]

    def m(sel):
        return list_metrics(lists[sel], n_items, train_counts, tail, k)

    return {"k": k, "tail_items": "the two rarest item-frequency bins (Q0, Q1) by training count",
            "overall": m(np.ones(len(users), dtype=bool)),
            "by_item_freq": [{"bin": b["bin"], **m(tgt_bin == i)} for i, b in enumerate(bins)],
            "cold_users": m(cold), "warm_users": m(~cold)}
