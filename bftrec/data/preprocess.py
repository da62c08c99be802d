"""Preprocessing: canonical frame -> ``SeqData`` (DESIGN.md "Data protocol").

Order of the steps:

1. drop exact duplicate ``(user, item, timestamp)`` rows, keeping the first (only with ``dedup``
   and timestamps: without timestamps a repeated pair is a real repeat event);
2. k-core to a **fixed point** (``kcore > 0``): drop users and items with fewer than k interactions
   (repeats count), again and again until nothing changes;
3. drop users with fewer than ``min_user_interactions`` (>= 3) interactions, and count them (done
   before the remap so that every item id 1..N occurs; after a k-core with k >= 3 nothing is dropped);
4. a **stable** sort by ``(user, timestamp, original row order)``; without timestamps by
   ``(user, original row order)``, so the file order is the event order;
5. remap ids. Users and items are numbered in the *natural order of their original ids*: by integer
   value when every id is an integer, else by string. Users get ``0..U-1``; items get ``1..N``, with
   ``0`` = padding (and BERT4Rec's mask = ``N + 1``). So the remap does not depend on the row order
   (shuffled input rows give identical arrays whenever timestamps order each user's events), and
   data that already uses ids ``1..N`` (S3-Rec files) keeps its item ids.

The split is leave-one-out: per user, the last item is the test target, the second-to-last the
validation target, the rest is training. Item statistics come from training interactions only.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np
import pandas as pd
from tabulate import tabulate

from bftrec.data.config import DatasetConfig, check_config

log = logging.getLogger(__name__)

PAD = "<pad>"


class SplitView(NamedTuple):
    """Leave-one-out view: user ``users[j]`` has inputs ``items[offsets[j]:offsets[j+1]]``
    (chronological, strictly the prefix before its target) and target ``targets[j]``."""

    offsets: np.ndarray  # (U+1,) int64
    items: np.ndarray  # (M,) int64 remapped item ids 1..N
    targets: np.ndarray  # (U,) int64
    users: np.ndarray  # (U,) int64 remapped user index


@dataclass
class SeqData:
    """Preprocessed per-user sequences (all numpy, deterministic).

    ``items[offsets[u]:offsets[u+1]]`` is user ``u``'s chronological sequence. Every user has at
    least 3 interactions.
    """

    name: str
    n_items: int  # N: item ids are 1..N, 0 = padding, N + 1 = BERT4Rec's mask
    user_ids: np.ndarray  # (U,) object: original user id of each remapped user index
    item_ids: np.ndarray  # (N+1,) object: original item id of each remapped item id; [0] = "<pad>"
    items: np.ndarray  # (nnz,) int64 item ids, grouped by user, chronological
    timestamps: Optional[np.ndarray]  # (nnz,) int64 unix seconds; None when the source has none
    offsets: np.ndarray  # (U+1,) int64
    stats: dict = field(default_factory=dict)  # preprocessing report, json-serialisable

    @property
    def n_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """(U,) int64 sequence length per user."""
        return np.diff(self.offsets)

    def sequence(self, u: int) -> np.ndarray:
        """(len_u,) int64 chronological item ids of user ``u``."""
        return self.items[self.offsets[u] : self.offsets[u + 1]]

    def _prefix(self, drop: int) -> tuple[np.ndarray, np.ndarray]:
        """(nnz,) bool mask of each user's first ``len - drop`` events, and their offsets."""
        lengths = self.lengths
        pos = np.arange(len(self.items)) - np.repeat(self.offsets[:-1], lengths)
        keep = pos < np.repeat(lengths - drop, lengths)
        offsets = np.concatenate(([0], np.cumsum(lengths - drop))).astype(np.int64)
        return keep, offsets

    def train_counts(self) -> np.ndarray:
        """(N+1,) int64 count of each item over TRAINING interactions only (each user's
        ``items[:-2]``); index 0 (padding) is 0."""
        keep, _ = self._prefix(2)
        return np.bincount(self.items[keep], minlength=self.n_items + 1).astype(np.int64)

    def split(self, which: str) -> SplitView:
        """Leave-one-out inputs and targets for every user.

        ``"valid"``: inputs ``items[:-2]`` (= the training sequence), target ``items[-2]``;
        ``"test"``: inputs ``items[:-1]``, target ``items[-1]``. Raises ``ValueError`` otherwise.
        """
        drop = {"valid": 2, "test": 1}.get(which)
        if drop is None:
            raise ValueError(f"unknown split {which!r}; known: test, valid")
        keep, offsets = self._prefix(drop)
        targets = self.items[self.offsets[1:] - drop]
        return SplitView(offsets, self.items[keep], targets, np.arange(self.n_users, dtype=np.int64))

    def split_timestamps(self, which: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Timestamps aligned with ``split(which)``: ``(inputs (M,), targets (U,))`` int64 unix
        seconds, or ``None`` when the data has no timestamps."""
        if self.timestamps is None:
            return None
        drop = {"valid": 2, "test": 1}[which]
        keep, _ = self._prefix(drop)
        return self.timestamps[keep], self.timestamps[self.offsets[1:] - drop]


def natural_order(ids: np.ndarray) -> np.ndarray:
    """Rank (0-based) of every id in natural order: integer value if all ids are integers, else
    string order; ties (``"01"`` vs ``"1"``) broken by the string."""
    s = np.asarray(ids, dtype=str)
    try:
        as_int = s.astype(np.int64)
    except (ValueError, OverflowError):
        order = np.argsort(s, kind="stable")
    else:
        order = np.lexsort((s, as_int))
    rank = np.empty(len(s), dtype=np.int64)
    rank[order] = np.arange(len(s))
    return rank


def kcore(users: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """Iterate the k-core filter to a fixed point.

    ``users``/``items`` are (n,) int codes. Returns the (n,) bool mask of the rows kept and the
    number of passes that removed rows. Every kept user and item has >= k kept rows.
    """
    keep = np.ones(len(users), dtype=bool)
    rounds = 0
    while True:
        u, i = users[keep], items[keep]
        ok = (np.bincount(u)[u] >= k) & (np.bincount(i)[i] >= k)
        if ok.all():
            return keep, rounds
        rounds += 1
        idx = np.flatnonzero(keep)
        keep[idx[~ok]] = False
        if not keep.any():
            return keep, rounds


def _tie_rate(offsets: np.ndarray, ts: Optional[np.ndarray]) -> Optional[float]:
    """Share of consecutive interactions of the same user with equal timestamps."""
    if ts is None or len(ts) < 2:
        return None
    same_user = np.ones(len(ts) - 1, dtype=bool)
    starts = offsets[1:-1]
    same_user[starts[(starts > 0) & (starts < len(ts))] - 1] = False
    pairs = int(same_user.sum())
    return float(((ts[1:] == ts[:-1]) & same_user).sum() / pairs) if pairs else None


def preprocess(df: pd.DataFrame, cfg: DatasetConfig) -> SeqData:
    """Canonical frame (``user``, ``item``, ``timestamp``; see ``bftrec.data.readers``) -> SeqData.

    Raises a one-line ``ValueError`` when timestamps are only partly present, when the k-core
    empties the data, or when no user is left.
    """
    check_config(cfg)
    n_raw = len(df)
    ucode, uniq_u = pd.factorize(df["user"].to_numpy(), sort=False)
    icode, uniq_i = pd.factorize(df["item"].to_numpy(), sort=False)
    ts_col = df["timestamp"]
    missing = ts_col.isna().to_numpy()
    has_ts = bool(n_raw) and not missing.any()
    if missing.any() and not missing.all():
        raise ValueError(f"dataset {cfg.name!r}: {int(missing.sum())} of {n_raw} rows lack a "
                         "timestamp; timestamps must be all present or all absent")
    ts = ts_col.to_numpy(dtype=np.int64) if has_ts else None
    stats: dict = {
        "raw_users": len(uniq_u), "raw_items": len(uniq_i), "raw_interactions": n_raw,
        "has_timestamps": has_ts,
    }
    keep = np.ones(n_raw, dtype=bool)

    # 1. exact duplicates
    if cfg.dedup and has_ts:
        keep = ~pd.DataFrame({"u": ucode, "i": icode, "t": ts}).duplicated(keep="first").to_numpy()
    stats["duplicates_dropped"] = int(n_raw - keep.sum())

    # 2. k-core to a fixed point
    rounds, removed = 0, 0
    if cfg.kcore > 0:
        idx = np.flatnonzero(keep)
        core, rounds = kcore(ucode[idx], icode[idx], cfg.kcore)
        removed = int((~core).sum())
        if not core.any():
            raise ValueError(f"dataset {cfg.name!r}: the {cfg.kcore}-core is empty; "
                             f"try a smaller kcore (e.g. {max(cfg.kcore // 2, 1)}) or kcore: 0")
        keep[idx[~core]] = False
    stats.update(kcore=cfg.kcore, kcore_rounds=rounds, kcore_removed=removed)

    # 3. short users
    counts = np.bincount(ucode[keep], minlength=len(uniq_u))
    short = (counts > 0) & (counts < cfg.min_user_interactions)
    short_rows = keep & short[ucode]
    stats["short_users_dropped"] = int(short.sum())
    stats["short_interactions_dropped"] = int(short_rows.sum())
    if short.any():
        log.info("%s: dropped %d users with < %d interactions (%d interactions)", cfg.name,
                 int(short.sum()), cfg.min_user_interactions, int(short_rows.sum()))
    keep &= ~short_rows
    if not keep.any():
        raise ValueError(f"dataset {cfg.name!r}: no user has >= {cfg.min_user_interactions} "
                         "interactions after preprocessing")

    # 4. remap in natural id order, 5. stable sort by (user, timestamp, row)
    rows = np.flatnonzero(keep)
    u_used = np.unique(ucode[rows])
    i_used = np.unique(icode[rows])
    u_map = np.full(len(uniq_u), -1, dtype=np.int64)
    u_map[u_used] = natural_order(np.asarray(uniq_u)[u_used])
    i_map = np.full(len(uniq_i), -1, dtype=np.int64)
    i_map[i_used] = natural_order(np.asarray(uniq_i)[i_used]) + 1
    user = u_map[ucode[rows]]
    order = np.lexsort((rows, ts[rows], user)) if has_ts else np.lexsort((rows, user))
    rows, user = rows[order], user[order]

    n_users, n_items = len(u_used), len(i_used)
    user_ids = np.empty(n_users, dtype=object)
    user_ids[u_map[u_used]] = np.asarray(uniq_u, dtype=object)[u_used]
    item_ids = np.empty(n_items + 1, dtype=object)
    item_ids[0] = PAD
    item_ids[i_map[i_used]] = np.asarray(uniq_i, dtype=object)[i_used]
    items = i_map[icode[rows]]
    offsets = np.concatenate(([0], np.cumsum(np.bincount(user, minlength=n_users)))).astype(np.int64)
    timestamps = ts[rows].astype(np.int64) if has_ts else None

    repeats = int(pd.DataFrame({"u": user, "i": items}).duplicated().sum())
    stats.update(
        users=n_users, items=n_items, interactions=len(items),
        mean_len=round(len(items) / n_users, 4),
        tie_rate=_tie_rate(offsets, timestamps),
        repeat_interactions=repeats,
    )
    log.info("%s: preprocessing\n%s", cfg.name, report_table(stats))
    return SeqData(cfg.name, n_items, user_ids, item_ids, items.astype(np.int64), timestamps,
                   offsets, stats)


def report_table(stats: dict) -> str:
    """The preprocessing report of ``preprocess`` (its ``stats`` dict) as a small readable table:
    raw counts, what each step dropped, the final counts (``tabulate``, plain format)."""
    s = dict(stats)

    def triple(prefix: str) -> str:
        return " / ".join(f"{s.pop(prefix + k):,}" for k in ("users", "items", "interactions"))

    rows = [("raw users / items / interactions", triple("raw_")),
            ("duplicates dropped", f"{s.pop('duplicates_dropped'):,}"),
            ("k-core", f"k={s.pop('kcore')}: {s.pop('kcore_rounds')} rounds, "
                       f"{s.pop('kcore_removed'):,} interactions removed"),
            ("short users dropped", f"{s.pop('short_users_dropped'):,} "
                                    f"({s.pop('short_interactions_dropped'):,} interactions)"),
            ("users / items / interactions", triple("")),
            ("mean length", f"{s.pop('mean_len'):.2f}"),
            ("tie rate", "n/a (no timestamps)" if s.get("tie_rate") is None else f"{s.pop('tie_rate'):.4f}"),
            ("repeat interactions", f"{s.pop('repeat_interactions'):,}")]
    s.pop("tie_rate", None)
    rows += [(k.replace("_", " "), str(v)) for k, v in s.items()]  # anything else (has_timestamps, source)
    return tabulate(rows, tablefmt="plain")
