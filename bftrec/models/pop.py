"""Most-popular items (``model=pop``): the floor every sequential recommender should clear.

Every user gets the same ranking: items by their training count (``DataInfo.train_counts``: training
interactions only, as the item-frequency strata count them), ties broken by the smaller item id, so the
ranking is deterministic (scores are the exact ranks, ``popularity_scores``). The history is excluded as for every
model (``eval.exclude_history``), which is
why two users' lists can still differ. Nothing is trained: ``trainable = False``, and the trainer scores
validation once and keeps the result (``bftrec.trainer.fit``).

Source: the popularity baseline of every peer framework (RecBole ``Pop``, Elliot ``MostPop``, RecTools
``PopularModel``). Deviations: none beyond the deterministic tie-break.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from bftrec.config import ConfigError
from bftrec.models.base import MODELS, DataInfo, SeqRecModel, check_common, check_standard_layer_only


@dataclass
class PopConfig:
    name: str = "pop"
    d_model: int = 1           # unused (every model has the common fields)
    n_layers: int = 0          # unused: no layers
    n_heads: int = 1           # unused
    d_ff: int = 1              # unused
    dropout: float = 0.0       # unused
    attn_dropout: float = 0.0  # unused
    max_len: int = 50          # history length handed to the model (unused by its scores)
    loss: str = "ce"           # unused: nothing is trained
    n_negatives: int = 1       # unused
    init_std: float = 0.02     # unused
    ce_chunk: int = 128        # unused
    negatives_per: str = "batch"  # unused


def popularity_scores(train_counts: np.ndarray) -> torch.Tensor:
    """(N + 1,) float32 popularity score per item id: N + 1 − its rank by (training count descending, id
    ascending), so the most popular item scores N and ties go to the smaller id; integers, exact in float32 for
    N < 2**24 (a count plus a fractional tie-break would merge neighbours once counts reach the thousands).
    Column 0 (padding) is -inf."""
    counts = np.asarray(train_counts, dtype=np.int64)  # (N + 1,)
    n = len(counts)
    order = np.lexsort((np.arange(1, n), -counts[1:])) + 1  # item ids, most popular first, ties by id
    scores = np.empty(n, dtype=np.float64)
    scores[order] = np.arange(n - 1, 0, -1)  # N, N - 1, ..., 1
    scores[0] = -np.inf
    return torch.as_tensor(scores, dtype=torch.float32)


@MODELS.register("pop")
class Pop(SeqRecModel):
    """Scores every item by its training count, the same for every user."""

    Config = PopConfig
    causal = True
    trainable = False
    standard_layer_only = True  # no Transformer layers: refused before any data is read

    def __init__(self, cfg: PopConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        check_standard_layer_only(cfg.name, layer_cfg)
        self.cfg, self.n_items = cfg, info.n_items
        self.register_buffer("scores", popularity_scores(info.train_counts))  # (N + 1,) float32

    def fit_statistics(self, items: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Nothing to count beyond ``DataInfo.train_counts`` (read at construction)."""

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None, last_only: bool = False) -> torch.Tensor:
        """No hidden states: (B, L, 0) float32 (a statistical model has no encoder)."""
        return torch.zeros(*item_seq.shape, 0, device=item_seq.device)

    def training_loss(self, batch: dict) -> torch.Tensor:
        raise ConfigError(f"model={self.cfg.name} is not trained (trainable = False): the trainer counts and scores it")

    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, N + 1) float32: the popularity scores, one row per user of ``batch["item_seq"]`` (B, L) int64."""
        return self.scores[None].expand(batch["item_seq"].shape[0], -1).clone()
