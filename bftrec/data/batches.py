"""Leave-one-out splits and left-padded batch windows, vectorised over users.

Protocol (DESIGN.md "Data protocol"): for each user's chronological sequence ``s`` the last item is
the test target, the second-to-last the validation target, the rest is training.
- training inputs: ``s[:-2]``;
- validation: history ``s[:-2]``, target ``s[-2]``;
- test: history ``s[:-1]`` (includes the validation item), target ``s[-1]``.
Windows are left-padded with 0 and keep the most recent items, so the last column is always the
prediction position. Training windows (``train_window_bounds``): each user's most recent
``max_len + 1`` training items (``last``), or the whole training part cut into such windows
(``sliding``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bftrec.config import ConfigError, check_choice


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


TRAIN_WINDOW_MODES = ("last", "sliding", "prefixes")


def train_window_bounds(offsets: np.ndarray, length: int, mode: str = "last",
                        stride: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which training windows an epoch holds: per window its user, start and end offsets.

    A window is the last ``length = max_len + 1`` items of ``items[start:end]`` (``windows``), left
    padded; a next-item model predicts its columns 1..length-1 from the columns before them. With
    ``n`` training items ``t_0 .. t_{n-1}`` (``s[:-2]``) per user:

    - ``last`` (SASRec, HSTU and the HSTU reference): one window per user, ending at ``n``: the
      targets ``t_i`` with ``n - max_len <= i <= n - 1`` (all of ``t_1 ..`` when ``n <= max_len + 1``).
    - ``sliding``: windows ending at ``e = n, n - S, n - 2S, ...`` while ``e >= 2`` (stride ``S``,
      ``1 <= S <= max_len``; default ``max_len``). Window ``e`` predicts ``t_i`` for
      ``max(1, e - max_len) <= i <= e - 1``, so ``t_i`` (``i >= 1``) is predicted once per ``e`` with
      ``i < e <= min(i + max_len, n)``: with ``S = max_len`` exactly once per epoch; with
      ``S < max_len`` ``floor(max_len / S)`` or ``ceil(max_len / S)`` times, except the most recent
      targets (``i > n - 1 - max_len``): ``1 + floor((n - 1 - i) / S)`` times, at least once.
      ``t_0`` is never a next-item target (it has no history), as in ``last``; a validation or test
      item is never in a window. BERT4Rec's cloze uses a window's last ``max_len`` columns, which
      tile ``t_1 .. t_{n-1}`` exactly when ``S = max_len``.
    - ``prefixes`` (RecBole's sequential data augmentation): one window per target, ending at every
      ``e = n, n - 1, ..., 2``: window ``e`` holds ``t_{e-1}`` as its last column and up to ``max_len``
      items before it. The trainer then scores the last column only (``batch["last_target_only"]``), so
      each ``t_i`` (``i >= 1``) is one sample, with its own dropout draw, once per epoch.

    Rows are ordered window-age first: rows ``0 .. U-1`` are the ``last`` windows of users
    ``0 .. U-1`` (so the first training batch, used for BFT calibration, is the same in both modes),
    then every user's second most recent window, and so on.

    Args:
        offsets: (U + 1,) int64 sequence offsets (CSR); every user has >= 3 interactions.
        length: window length ``max_len + 1``.
        mode: one of ``TRAIN_WINDOW_MODES``.
        stride: ``S`` for ``sliding``; None = ``length - 1``; refused for ``last`` and ``prefixes``.
    Returns:
        users, start, end: (W,) int64 each; ``windows(items, start, end, length)`` gives the windows.
    Raises:
        ConfigError: unknown mode, or a stride outside ``1 .. length - 1``.
    """
    check_train_windows(mode, stride, length - 1)
    start, end = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64) - 2  # (U,) training part
    users = np.arange(len(start), dtype=np.int64)
    if mode == "last":
        return users, start, end
    step = 1 if mode == "prefixes" else length - 1 if stride is None else stride
    count = 1 + np.maximum(end - start - 2, 0) // step  # (U,) windows per user: ends e >= 2 (or one)
    age = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)  # (W,) 0 = most recent
    order = np.argsort(age, kind="stable")  # age first, users ascending inside one age
    rows = np.repeat(users, count)[order]
    return rows, start[rows], end[rows] - age[order] * step


def check_train_windows(mode: str, stride: int | None, max_len: int | None) -> None:
    """One-line ConfigError for an unknown window ``mode``, a stride outside 1..max_len (None: >= 1), or a
    stride given with a mode other than ``sliding``, where it would be silently ignored."""
    check_choice(mode, TRAIN_WINDOW_MODES, "trainer.train_windows")
    if stride is not None and mode != "sliding":
        raise ConfigError(f"trainer.train_window_stride={stride} has no effect with trainer.train_windows={mode}; "
                          "set trainer.train_windows=sliding, or drop the stride")
    if stride is not None and not 1 <= stride <= (max_len if max_len is not None else stride):
        raise ConfigError(f"trainer.train_window_stride={stride} must be in 1..model.max_len={max_len} "
                         "(null = max_len: every target once per epoch)")


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
