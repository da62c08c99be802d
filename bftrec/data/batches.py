"""Leave-one-out splits and left-padded batch windows, vectorised over users.

Protocol (DESIGN.md "Data protocol"): for each user's chronological sequence ``s`` the last item is
the test target, the second-to-last the validation target, the rest is training.
- training inputs: ``s[:-2]``;
- validation: history ``s[:-2]``, target ``s[-2]``;
- test: history ``s[:-1]`` (includes the validation item), target ``s[-1]``.
Windows are left-padded with 0 and keep the most recent items, so the last column is always the
prediction position.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Split:
    """One evaluation split. Arrays are aligned per user.

    Attributes:
        users: (U,) int64 user index.
        start: (U,) int64 offset of the user's first item in ``items``.
        end: (U,) int64 offset one past the last history item; the target is ``items[end]``.
        targets: (U,) int64 target item id.
    """

    users: np.ndarray
    start: np.ndarray
    end: np.ndarray
    targets: np.ndarray

    @property
    def history_len(self) -> np.ndarray:
        """(U,) int64 number of interactions before the target."""
        return self.end - self.start

    def subset(self, idx: np.ndarray) -> Split:
        return Split(self.users[idx], self.start[idx], self.end[idx], self.targets[idx])


def loo_split(items: np.ndarray, offsets: np.ndarray, which: str) -> Split:
    """Leave-one-out split ``which`` in {"valid", "test"} of sequences given as (items, offsets).

    Raises:
        ValueError: unknown split, or a user with fewer than 3 interactions (preprocessing drops them).
    """
    lengths = np.diff(offsets)
    if len(lengths) and lengths.min() < 3:
        u = int(np.argmin(lengths))
        raise ValueError(f"user index {u} has {lengths[u]} interactions; leave-one-out needs >= 3 "
                         f"(set dataset.min_user_interactions >= 3)")
    back = {"valid": 2, "test": 1}.get(which)
    if back is None:
        raise ValueError(f"unknown split {which!r}; choose valid or test")
    start = offsets[:-1].astype(np.int64)
    end = offsets[1:].astype(np.int64) - back
    return Split(np.arange(len(start), dtype=np.int64), start, end, items[end].astype(np.int64))


def windows(values: np.ndarray, start: np.ndarray, end: np.ndarray, length: int) -> np.ndarray:
    """The last ``length`` entries of ``values[start:end]`` per row, left-padded with 0.

    values (nnz,), start/end (B,) int64 -> (B, length) of values.dtype.
    """
    idx = end[:, None] - length + np.arange(length)[None, :]  # (B, length)
    ok = idx >= start[:, None]
    return np.where(ok, values[np.clip(idx, 0, None)], 0).astype(values.dtype)


def train_windows(items: np.ndarray, offsets: np.ndarray, length: int) -> np.ndarray:
    """(U, length) int64: the most recent ``length`` training items (``s[:-2]``) of every user."""
    return windows(items, offsets[:-1], offsets[1:] - 2, length)


def history_pairs(items: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (row, item) pairs of each row's full history ``items[start:end]``.

    Returns rows (P,) int64 and item ids (P,) int64, P = sum of history lengths.
    """
    lens = end - start
    rows = np.repeat(np.arange(len(start)), lens)
    # position inside the row: arange(P) minus the row's first flat index
    first = np.repeat(np.cumsum(lens) - lens, lens)
    flat = np.repeat(start, lens) + (np.arange(lens.sum()) - first)
    return rows.astype(np.int64), items[flat].astype(np.int64)


def trim_left(x, *others):
    """Drop leading columns that are padding in every row of ``x`` (B, L) numpy or torch; the same
    columns of ``others``. Returns ``x`` alone, or the tuple ``(x, *others)``.

    Left padding carries no information (blocks mask it; positions count from the right), so a
    batch of short sequences costs what its longest sequence costs, not ``max_len``.
    """
    nonpad = (x != 0).any(0)
    first = int(nonpad.nonzero()[0][0]) if nonpad.any() else x.shape[1] - 1
    return (x[:, first:], *[o[:, first:] for o in others]) if others else x[:, first:]
