"""First-order item transitions (``model=markov``): the next item after the last one, as counted in training.

``fit_statistics`` counts, over every user's training sequence (the items before the validation target), each
pair of consecutive items a → b. A user whose history ends with item a gets, for every item b,

    score(b) = count(a → b) · (N + 1) + popularity rank score of b (``pop``'s: N for the most popular, 1 for the least),

so the transitions rank first and the training popularity orders equal counts, the items a never led to, and
every item when a has no recorded successor: a back-off to popularity. The scores are integers, exact in
float32 while (largest count + 1) · (N + 1) < 2**24; beyond that (not met on the datasets here) neighbours
may merge into pessimistic ties, and ``fit_statistics`` logs a warning. Ties among equally popular
items go to the smaller id. The counts are stored sparsely (CSR over the N + 1 source items), so memory grows
with the number of distinct pairs, not N². Nothing is trained (``trainable = False``).

Source: the first-order Markov chain over items (the MC part of FPMC, Rendle et al., WWW 2010), counted
rather than factorised, as the untrained item-transition heuristics that audits of sequential
recommendation use as a floor. Deviations: first order only, no smoothing beyond the popularity back-off.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from bftrec.models.base import MODELS, DataInfo
from bftrec.models.pop import Pop, PopConfig

log = logging.getLogger(__name__)


@dataclass
class MarkovConfig(PopConfig):
    """``PopConfig``'s fields (common, unused but ``max_len``: its last item is what counts)."""

    name: str = "markov"


def transition_counts(items: np.ndarray, start: np.ndarray, end: np.ndarray, n_items: int) -> tuple:
    """CSR counts of consecutive pairs within each sequence ``items[start[u]:end[u]]``.

    Args:
        items: (nnz,) int item ids 1..N; start, end: (U,) int64 bounds of each user's sequence.
    Returns:
        indptr (N + 2,) int64, indices (nnz_pairs,) int64 (target ids, sorted within a row), counts
        (nnz_pairs,) float32: row a holds the items that followed a, with how often.
    """
    items = np.asarray(items, dtype=np.int64)
    lengths = np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)
    if len(lengths) == 0 or lengths.max(initial=0) < 2:
        return np.zeros(n_items + 2, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    # positions p with p + 1 inside the same sequence: p from start to end - 2
    n_pairs = np.clip(lengths - 1, 0, None)
    first = np.repeat(np.asarray(start, dtype=np.int64), n_pairs)
    step = np.arange(n_pairs.sum()) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
    src, dst = items[first + step], items[first + step + 1]
    key, cnt = np.unique(src * (n_items + 1) + dst, return_counts=True)  # sorted by (src, dst)
    rows, cols = key // (n_items + 1), key % (n_items + 1)
    indptr = np.zeros(n_items + 2, dtype=np.int64)
    np.add.at(indptr, rows + 1, 1)
    return np.cumsum(indptr), cols.astype(np.int64), cnt.astype(np.float32)


@MODELS.register("markov")
class Markov(Pop):
    """Scores the items that followed the user's last item in training, backing off to popularity (``Pop``'s
    scores, the buffer ``scores``); no encoder and no loss, as ``Pop``."""

    Config = MarkovConfig

    def __init__(self, cfg: MarkovConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__(cfg, layer_cfg, info)  # the checks and the popularity ranks N..1, -inf at 0 (``scores``)
        self.register_buffer("indptr", torch.zeros(info.n_items + 2, dtype=torch.int64))
        self.register_buffer("indices", torch.zeros(0, dtype=torch.int64))
        self.register_buffer("counts", torch.zeros(0, dtype=torch.float32))

    def fit_statistics(self, items: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Count the transitions of the training sequences ``items[start[u]:end[u]]`` (``transition_counts``)."""
        indptr, indices, counts = transition_counts(items, start, end, self.n_items)
        if len(counts) and (counts.max() + 1) * (self.n_items + 1) >= 2**24:
            log.warning("markov: a transition count of %d with %d items exceeds float32's exact integers; "
                        "equal counts may tie instead of falling back to popularity", counts.max(), self.n_items)
        counts = counts * np.float32(self.n_items + 1)  # one count outranks every popularity rank
        dev = self.indptr.device
        self.indptr = torch.as_tensor(indptr, device=dev)
        self.indices = torch.as_tensor(indices, device=dev)
        self.counts = torch.as_tensor(counts, device=dev)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("indices", "counts"):  # their length is the data's: take the stored one
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, N + 1) float32 scores for the item after ``batch["item_seq"]`` (B, L) int64 (left-padded: the
        last column is the last item; an empty history gets popularity alone). Column 0 is -inf."""
        last = batch["item_seq"][:, -1]  # (B,)
        B = last.shape[0]
        scores = self.scores[None].expand(B, -1).clone()  # (B, N + 1): the popularity back-off
        lo, hi = self.indptr[last], self.indptr[last + 1]  # (B,) each; padding (0) has no successor row
        n = hi - lo
        if int(n.sum()) > 0:
            row = torch.repeat_interleave(torch.arange(B, device=last.device), n)  # (P,)
            pos = torch.repeat_interleave(lo, n) + torch.arange(int(n.sum()), device=last.device) \
                - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)  # (P,) entry of each pair in the CSR
            scores.index_put_((row, self.indices[pos]), self.counts[pos], accumulate=True)
        return scores
