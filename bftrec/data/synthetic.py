"""The embedded synthetic dataset (the default; no files needed).

It is built to look like real sequential-recommendation data and to be learnable:

- **power-law popularity**: the item of popularity rank r (a random permutation of ids) has weight
  ``r ** -zipf_exponent``;
- **many short histories among long ones**: a share ``short_user_share`` of users has a length drawn
  uniformly from ``[short_min_len, short_max_len]``; the others have ``short_max_len + 1 +
  Exponential(long_mean_len - short_max_len - 1)`` interactions, capped at ``max_len_cap``;
- **a latent transition structure**: every item has ``n_successors`` distinct successor items, drawn
  without replacement with weight ``popularity ** successor_pop_bias`` (never the item itself). Each next item
  is, with probability ``p_transition``, a uniformly chosen successor of the previous item; with
  probability ``noise`` a uniformly random item; otherwise a popularity draw. The first item is a
  popularity draw. A sequence model that learns the successor table predicts the next item about
  ``p_transition`` of the time from ``n_successors`` candidates, far above popularity;
- **increasing integer timestamps** (unix seconds): the first one uniform in
  ``[start_time, start_time + time_span)``, then gaps of ``1 + Exponential(mean_gap - 1)`` seconds,
  so a user's timestamps strictly increase (no ties).

**The positive control** (off by default; ``results/positive_control``) plants unreliability whose
ground truth ``generate_with_truth`` returns beside the data:

- a share ``unreliable_share`` of items is *unreliable*, drawn without replacement with weight
  ``popularity ** -unreliable_rare_bias`` (rare items first): an unreliable item is emitted like any other,
  but the item after it does not depend on it: transitions follow the *last reliable* item of the user
  (the anchor), so a model should learn to give such a token little weight (BFT: a low initial precision τ);
- a share ``noisy_user_share`` of users has, at each position after the first, probability
  ``noisy_user_rate`` that a uniformly random item is inserted; the chain ignores it (the anchor stays),
  so these users' contexts are inconsistent (BFT: the REML step should down-weight them);
- ``oracle_clean`` drops every planted position (unreliable items and insertions) from each history but a
  user's first and last interaction (and, for a user who would keep fewer than 3, the most recent planted
  ones), so that the test targets stay those of the planted data while the test inputs are clean: the
  ceiling of what denoising can give (its validation targets may differ: they only select the epoch).
With all knobs at 0 the main generator's draws are untouched (the planting uses ``default_rng([seed, 1])``).

Ids are decimal strings: users ``"1".."n_users"``, items ``"1".."n_items"``, so the remap keeps them.
Generation is vectorised over users (one numpy step per position) and takes well under a second
for the default 2,000 users x 600 items (about 15 interactions per user on average; the successor
table costs time proportional to ``n_items ** 2``).

With the defaults (seed 0) the top 10% of items hold about 52% of the interactions, 58% of users
have at most 8 interactions, and on the leave-one-out test split (history excluded) popularity gets
HR@10 ~ 0.27 while a bigram model counted on the training sequences gets ~ 0.70, so a sequence model
has a lot to learn beyond popularity.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from bftrec.data.config import SyntheticConfig


def _lengths(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    short = rng.random(cfg.n_users) < cfg.short_user_share
    lo = cfg.short_max_len + 1
    extra = rng.exponential(max(cfg.long_mean_len - lo, 1e-9), cfg.n_users)
    long_len = np.minimum(lo + np.round(extra).astype(np.int64), cfg.max_len_cap)
    short_len = rng.integers(cfg.short_min_len, cfg.short_max_len + 1, cfg.n_users)
    return np.where(short, short_len, np.maximum(long_len, cfg.short_min_len))


def _successors(cfg: SyntheticConfig, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n_items, n_successors) distinct successors per item, never the item itself: Gumbel top-k,
    i.e. sampling without replacement with weight ``pop ** successor_pop_bias`` (in row blocks)."""
    m, k = len(pop), cfg.n_successors
    logw = cfg.successor_pop_bias * np.log(pop)
    block = max(1, 2_000_000 // m)
    out = np.empty((m, k), dtype=np.int64)
    for lo in range(0, m, block):
        rows = np.arange(lo, min(lo + block, m))
        scores = logw[None, :] + rng.gumbel(size=(len(rows), m))
        scores[np.arange(len(rows)), rows] = -np.inf
        out[rows] = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return out


def generate(cfg: SyntheticConfig) -> pd.DataFrame:
    """Generate the canonical frame (``user``, ``item`` str; ``timestamp`` int64 unix seconds).

    Deterministic for ``cfg.seed``. Rows are grouped by user, chronological.
    """
    return generate_with_truth(cfg)[0]


def _unreliable_items(cfg: SyntheticConfig, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n_items,) bool: ``round(unreliable_share * n_items)`` items drawn without replacement with weight
    ``pop ** -unreliable_rare_bias`` (Gumbel top-k)."""
    m = len(pop)
    k = int(round(cfg.unreliable_share * m))
    out = np.zeros(m, dtype=bool)
    if k:
        scores = -cfg.unreliable_rare_bias * np.log(pop) + rng.gumbel(size=m)
        out[np.argpartition(-scores, k - 1)[:k]] = True
    return out


def generate_with_truth(cfg: SyntheticConfig) -> tuple[pd.DataFrame, dict]:
    """The canonical frame (as ``generate``) and its ground truth.

    Returns:
        (frame, truth): truth = {"item_reliable": {raw item id str: bool}, "planted": (rows,) bool per frame
        row (an unreliable item or an inserted random item), "inserted": (rows,) bool (inserted random items
        only), "noisy_user": {raw user id str: bool}, "successors": {raw item id: [raw ids of its latent
        successors]}}. With ``oracle_clean`` the planted rows are dropped
        (but each user's first and last) and ``planted`` describes the rows that remain.
    """
    rng = np.random.default_rng(cfg.seed)
    plant = np.random.default_rng([cfg.seed, 1])  # the planting's own draws: the knobs at 0 change nothing
    n, m = cfg.n_users, cfg.n_items
    weight = np.arange(1, m + 1, dtype=np.float64) ** -cfg.zipf_exponent
    pop = np.empty(m)
    pop[rng.permutation(m)] = weight / weight.sum()  # pop[item] = probability
    cum_pop = np.cumsum(pop)

    succ = _successors(cfg, pop, rng)
    unreliable = _unreliable_items(cfg, pop, plant)
    noisy_user = plant.random(n) < cfg.noisy_user_share

    lengths = _lengths(cfg, rng)
    max_len = int(lengths.max())
    seq = np.zeros((n, max_len), dtype=np.int64)
    inserted = np.zeros((n, max_len), dtype=bool)
    seq[:, 0] = np.minimum(np.searchsorted(cum_pop, rng.random(n)), m - 1)
    anchor = np.where(unreliable[seq[:, 0]], -1, seq[:, 0])  # the last reliable genuine item; -1: none yet
    for t in range(1, max_len):
        r = rng.random(n)
        nxt = np.minimum(np.searchsorted(cum_pop, rng.random(n)), m - 1)  # popularity draw
        follow = r < cfg.p_transition
        noisy = (r >= cfg.p_transition) & (r < cfg.p_transition + cfg.noise)
        pick = rng.integers(0, cfg.n_successors, int(follow.sum()))
        has = anchor[follow] >= 0
        nxt[np.flatnonzero(follow)[has]] = succ[anchor[follow][has], pick[has]]  # no anchor: the popularity draw
        nxt[noisy] = rng.integers(0, m, int(noisy.sum()))
        if cfg.noisy_user_share > 0 and cfg.noisy_user_rate > 0:
            ins = noisy_user & (plant.random(n) < cfg.noisy_user_rate)
            inserted[:, t] = ins
            nxt = np.where(ins, plant.integers(0, m, n), nxt)
        seq[:, t] = nxt
        genuine = ~inserted[:, t] & ~unreliable[nxt]
        anchor = np.where(genuine, nxt, anchor)

    gaps = 1 + np.round(rng.exponential(max(cfg.mean_gap - 1, 0), (n, max_len))).astype(np.int64)
    gaps[:, 0] = cfg.start_time + rng.integers(0, max(cfg.time_span, 1), n)
    times = np.cumsum(gaps, axis=1)

    mask = np.arange(max_len)[None, :] < lengths[:, None]
    planted = inserted | unreliable[seq]
    if cfg.oracle_clean:  # drop planted rows but the first and the last (the test target); keep >= 3 rows
        pos = np.arange(max_len)[None, :]
        drop = mask & planted & (pos > 0) & (pos < lengths[:, None] - 1)
        rank_back = np.cumsum(drop[:, ::-1], axis=1)[:, ::-1]  # 1 = the user's most recent dropped row
        spare = np.maximum(3 - (mask.sum(1) - drop.sum(1)), 0)  # rows a short user must keep back
        mask = mask & ~(drop & (rank_back > spare[:, None]))
    users = np.repeat(np.arange(1, n + 1), mask.sum(1))
    frame = pd.DataFrame({
        "user": pd.array(users.astype(str), dtype=str),
        "item": pd.array((seq[mask] + 1).astype(str), dtype=str),
        "timestamp": times[mask].astype(np.int64),
    })
    truth = {"item_reliable": {str(i + 1): bool(not unreliable[i]) for i in range(m)},
             "planted": planted[mask], "inserted": inserted[mask],
             "noisy_user": {str(u + 1): bool(noisy_user[u]) for u in range(n)},
             "successors": {str(i + 1): [str(j + 1) for j in succ[i]] for i in range(m)}}
    return frame, truth
