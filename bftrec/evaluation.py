"""Model + split -> per-user rank table (DESIGN.md "Evaluation protocol").

Default protocol: **full ranking** over all N items, excluding the user's history items other than the
target (``eval.exclude_history``): all of them, or with ``eval.exclude_scope=window`` only those in the
scored window (the last ``max_len``), as the HSTU reference does (``invalid_ids=past_ids`` in its
``research/data/eval.py``), which leaves a long history's older items rankable (and a target repeating
one of them rankable under ``mask``; full ranking only). A target that repeats a history item stays
rankable with ``eval.repeat_target=keep``; with ``mask`` it is excluded too (S3-Rec, HSTU repository),
which counts as a miss (rank N + 1). Ties are pessimistic. Scoring is chunked over users
(``eval.batch_size``), so memory stays bounded; results do not depend on the chunk size. Under
torch.distributed each process scores users ``rank::world_size`` and the tables are gathered, so each
user is scored once.

The sampled protocol (``sampled100``) ranks the target among ``eval.n_negatives`` negatives drawn
once per user by a dedicated seeded generator, uniformly or by training popularity, never from the
user's history. It exists only to compare with old papers.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import pandas as pd
import torch

from bftrec.config import ConfigError, EvalConfig, check_choice
from bftrec.data.batches import Split, history_pairs, loo_split, trim_left, windows
from bftrec.metrics import ranks_from_scores
from bftrec.models.base import reused_score_buffer

log = logging.getLogger(__name__)

RANK_COLUMNS = ["user", "target", "rank", "history_len", "target_count"]


def check_eval_config(cfg: EvalConfig, n_items: int) -> None:
    """One-line errors for impossible evaluation settings."""
    from bftrec.metrics import check_k

    check_choice(cfg.protocol, ("full", "sampled100"), "eval.protocol")
    check_choice(cfg.repeat_target, ("keep", "mask"), "eval.repeat_target")
    check_choice(cfg.exclude_scope, ("all", "window"), "eval.exclude_scope")
    if cfg.exclude_scope == "window" and cfg.protocol == "sampled100":
        raise ConfigError("eval.exclude_scope=window applies to full ranking; sampled100 never draws negatives from "
                          "the history; use eval.protocol=full or eval.exclude_scope=all")
    check_choice(cfg.sampled_kind, ("uniform", "popularity"), "eval.sampled_kind")
    check_choice(cfg.bin_mode, ("equal_items", "equal_interactions"), "eval.bin_mode")
    for key in ("batch_size", "n_negatives", "n_bins"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"eval.{key}={getattr(cfg, key)} must be >= 1")
    if not cfg.ks:
        raise ConfigError("eval.ks is empty; give at least one cut-off, e.g. eval.ks=[10]")
    if cfg.cold_user_max_history is not None and cfg.cold_user_max_history < 0:
        raise ConfigError(f"eval.cold_user_max_history={cfg.cold_user_max_history} must be >= 0 or null")
    if not 0 < cfg.cold_share <= 1:
        raise ConfigError(f"eval.cold_share={cfg.cold_share} must be in (0, 1]")
    n_cand = n_items if cfg.protocol == "full" else cfg.n_negatives + 1
    if cfg.protocol == "sampled100" and cfg.n_negatives >= n_items:
        raise ConfigError(f"eval.n_negatives={cfg.n_negatives} must be < the number of items ({n_items})")
    check_k(list(cfg.ks), n_cand)


def check_n_bins(cfg: EvalConfig, train_counts: np.ndarray) -> None:
    """Refuse ``eval.n_bins`` above the number of distinct training counts of the catalogue (issue 50): some
    strata would be empty; the one line names the largest value that works. train_counts: (N + 1,) int64.
    Raises: ConfigError."""
    distinct = len(np.unique(train_counts[1:]))
    if cfg.n_bins > distinct:
        raise ConfigError(f"eval.n_bins={cfg.n_bins} exceeds the {distinct} distinct training counts of the "
                          f"{len(train_counts) - 1} items, so some strata would be empty; use eval.n_bins<={distinct}")


def check_candidates(items: np.ndarray, offsets: np.ndarray, which: str, n_items: int, max_len: int,
                     cfg: EvalConfig) -> None:
    """Refuse ``max(eval.ks)`` larger than the candidates some user of split ``which`` has left once its
    history is excluded (full ranking; issue 50): the target would be a hit whatever the scores. The one line
    names how many users and the largest K that every user can take.

    Args: items, offsets: the sequences (``SeqData``); which: ``valid`` or ``test``; n_items: N; max_len: the
    scored window (``eval.exclude_scope=window``).
    Raises: ConfigError.
    """
    if cfg.protocol != "full" or not cfg.exclude_history:
        return
    split = loo_split(items, offsets, which)
    first = split.start if cfg.exclude_scope == "all" else np.maximum(split.start, split.end - max_len)
    rows, cols = history_pairs(items, first, split.end)
    if cfg.repeat_target == "keep":  # a repeated target stays a candidate
        keep = cols != split.targets[rows]
        rows, cols = rows[keep], cols[keep]
    excluded = pd.DataFrame({"r": rows, "c": cols}).drop_duplicates().groupby("r").size()
    n_cand = n_items - excluded.reindex(range(len(split.users)), fill_value=0).to_numpy()  # (U,)
    k = max(cfg.ks)
    short = int((n_cand < k).sum())
    if short:
        raise ConfigError(f"eval.ks has K={k}, but {short} {which} users have fewer than {k} candidates once their "
                          f"history is excluded (as few as {int(n_cand.min())}), so they would count as hits "
                          f"whatever the scores; use K<={int(n_cand.min())} or eval.exclude_history=false")


def gather_topk(sink: list) -> tuple[np.ndarray, np.ndarray]:
    """(users (U,) int64, lists (U, K) int64) from ``rank_users``' ``topk_sink`` of every process."""
    rank, world = _dist()
    parts = [sink]
    if world > 1:
        parts = [None] * world
        torch.distributed.all_gather_object(parts, sink)
    chunks = [c for part in parts for c in part]
    if not chunks:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int64)
    return np.concatenate([u for u, _ in chunks]), np.concatenate([t for _, t in chunks])


def sample_candidates(items: np.ndarray, split: Split, n_items: int, cfg: EvalConfig,
                      train_counts: np.ndarray) -> np.ndarray:
    """(U, 1 + n_negatives) int64 fixed candidates per user, the target in column 0.

    Negatives exclude the user's history and target; drawn with ``np.random.default_rng(sample_seed)``.
    Raises ValueError when a user has fewer than ``n_negatives`` eligible items.
    """
    rng = np.random.default_rng(cfg.sample_seed)
    k = cfg.n_negatives
    p = None
    if cfg.sampled_kind == "popularity":
        w = train_counts[1: n_items + 1].astype(np.float64) + 1e-12
        p = w / w.sum()
    out = np.empty((len(split.users), 1 + k), dtype=np.int64)
    out[:, 0] = split.targets
    for r in range(len(split.users)):
        seen = set(items[split.start[r]:split.end[r]].tolist())
        seen.add(int(split.targets[r]))
        if n_items - len(seen) < k:
            raise ValueError(f"user {split.users[r]} has only {n_items - len(seen)} unseen items; "
                             f"lower eval.n_negatives={k}")
        chosen: list[int] = []
        while len(chosen) < k:
            draw = rng.choice(n_items, size=2 * k, p=p) + 1
            for it in draw.tolist():
                if it not in seen:
                    seen.add(it)
                    chosen.append(it)
                    if len(chosen) == k:
                        break
        out[r, 1:] = chosen
    return out


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _check_finite(scores: torch.Tensor, users: np.ndarray) -> None:
    """ValueError naming the user and item of the first non-finite score in columns 1.. of (B, N + 1).

    One reduction (a sum is finite iff every term is, barring overflow), the exact search only then.
    """
    if torch.isfinite(scores[:, 1:].sum()):
        return
    bad = ~torch.isfinite(scores[:, 1:])
    if bad.any():
        r, c = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"non-finite score {scores[r, c + 1].item()} for user {users[r]}, item {c + 1}: "
                         f"the model diverged; lower trainer.lr or check the data")


def _full_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Pessimistic ranks, ``1 + #{other items with score >= the target's}`` (as
    ``bftrec.metrics.ranks_from_scores``), of checked (B, N + 1) scores; overwrites ``scores`` with 0/1.

    No (B, N + 1) temporary: the comparison is written in place and summed in float32, exact while
    N + 1 <= 2**24 (larger tables, or other dtypes, go through ranks_from_scores). Returns (B,) int64.
    """
    if scores.shape[1] > 2 ** 24 or scores.dtype != torch.float32:
        return ranks_from_scores(scores, targets)
    target_score = scores.gather(1, targets[:, None])  # (B, 1), finite: checked, and never masked
    return scores.ge_(target_score).sum(1).to(torch.int64)  # the target counts itself: the "1 +"


@torch.no_grad()
def rank_users(model, items: np.ndarray, offsets: np.ndarray, timestamps: Optional[np.ndarray],
               which: str, n_items: int, max_len: int, train_counts: np.ndarray, cfg: EvalConfig,
               device: torch.device, mech_sink: Optional[list] = None, topk_sink: Optional[list] = None,
               topk: int = 10) -> pd.DataFrame:
    """Score every user of split ``which`` and return the rank table.

    Args:
        model: a backbone (``score_items``); put in eval mode here.
        items, offsets, timestamps: the preprocessed sequences (``SeqData``).
        which: ``valid`` or ``test``.
        n_items: N.
        max_len: history window length L handed to the model.
        train_counts: (N + 1,) int64 training counts (``target_count`` column, popularity sampling).
        cfg: evaluation settings.
        mech_sink: if a list is given and the model has BFT layers, per-chunk mechanism dicts
            (with the chunk's item windows and users) are appended to it.
        topk_sink: if a list is given (full ranking), ``(users (B,) int64, items (B, topk) int64)`` of each
            chunk's recommended lists, after history exclusion, best first, are appended to it (under
            torch.distributed, of this process's users: ``gather_topk`` collects them).
    Returns:
        DataFrame with columns user, target, rank, history_len, target_count; one row per user,
        sorted by user.
    Raises:
        ValueError: a non-finite model score (never silently ranked).
    """
    check_eval_config(cfg, n_items)
    split = loo_split(items, offsets, which)
    # candidates are drawn for all users in user order, so they do not depend on sharding
    cands = (sample_candidates(items, split, n_items, cfg, train_counts)
             if cfg.protocol == "sampled100" else None)
    rank, world = _dist()
    mine = np.arange(rank, len(split.users), world)
    # chunks of similar history length: trimming left padding then saves most of the work
    mine = mine[np.argsort(np.minimum(split.history_len[mine], max_len), kind="stable")]
    split = split.subset(mine)
    cands = cands[mine] if cands is not None else None
    was_training = model.training
    model.eval()
    out = []
    pool: dict = {}  # one (B, N + 1) score block for every chunk, not a fresh one per chunk
    for lo in range(0, len(split.users), cfg.batch_size):
        sl = slice(lo, lo + cfg.batch_size)
        part = split.subset(np.arange(len(split.users))[sl])
        x = windows(items, part.start, part.end, max_len)  # (B, L)
        t = windows(timestamps, part.start, part.end, max_len) if timestamps is not None else x
        x, t = trim_left(x, t)  # (B, L') with L' the chunk's longest history
        x = torch.from_numpy(x).to(device)
        batch = {"item_seq": x}
        if timestamps is not None:
            batch["time"] = torch.from_numpy(t).to(device)
        # fp32 scoring even under AMP training: bf16 scores create ties, and ties count against the target
        with reused_score_buffer(pool):
            scores = model.score_items(batch)[:, : n_items + 1].float()  # (B, N + 1)
        _check_finite(scores, part.users)
        tgt = torch.from_numpy(part.targets).to(device)
        miss = np.zeros(len(part.users), dtype=bool)
        if cfg.exclude_history:
            first = part.start if cfg.exclude_scope == "all" else np.maximum(part.start, part.end - max_len)
            rows, cols = history_pairs(items, first, part.end)
            is_repeat = cols == part.targets[rows]
            miss[np.unique(rows[is_repeat])] = cfg.repeat_target == "mask"
            if cfg.repeat_target == "keep":
                rows, cols = rows[~is_repeat], cols[~is_repeat]
            rows_t, cols_t = torch.from_numpy(rows).to(device), torch.from_numpy(cols).to(device)
            target_score = scores.gather(1, tgt[:, None]).clone()
            scores[rows_t, cols_t] = float("-inf")
            scores.scatter_(1, tgt[:, None], target_score)  # masked repeats are counted as misses below
        if cands is not None:
            c = torch.from_numpy(cands[sl]).to(device)
            r = ranks_from_scores(scores.gather(1, c), torch.zeros(len(c), dtype=torch.long, device=device))
        else:
            if topk_sink is not None:  # the lists as recommended, before _full_ranks overwrites the scores
                topk_sink.append((part.users, scores.topk(min(topk, n_items), dim=1).indices.cpu().numpy()))
            r = _full_ranks(scores, tgt)  # overwrites scores
        r = r.cpu().numpy()
        r[miss] = n_items + 1
        out.append(pd.DataFrame({"user": part.users, "target": part.targets, "rank": r,
                                 "history_len": part.history_len,
                                 "target_count": train_counts[part.targets]}))
        if mech_sink is not None:
            mech = model.mechanism(batch)
            if mech:
                mech_sink.append({"mech": mech, "item_seq": x, "users": part.users})
    model.train(was_training)
    table = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=RANK_COLUMNS)
    if world > 1:
        parts = [None] * world
        torch.distributed.all_gather_object(parts, table)
        table = pd.concat(parts, ignore_index=True)
    return table.sort_values("user", kind="stable").reset_index(drop=True)[RANK_COLUMNS]
