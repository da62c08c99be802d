"""The recommender contract every backbone implements, and the losses they share.

Contract (DESIGN.md "The two extension points"), three methods:

- ``encode(item_seq (B, L) int64, timestamps (B, L) int64 | None) -> (B, L, D) float``
- ``training_loss(batch) -> scalar``: the backbone owns its objective (next-item, cloze, ...).
- ``score_items(batch) -> (B, N + 1) float``: scores of every item id for the next position;
  padding (0) and special ids are ``-inf``.

Batches are dicts of tensors, all left-padded with 0 (the last column is the prediction position):

- training: ``seq`` (B, L + 1) int64, the most recent ``L + 1`` training items of each user, and
  ``time`` (B, L + 1) int64 unix seconds or absent;
- scoring: ``item_seq`` (B, L) int64 history, ``time`` (B, L) int64 or absent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bftrec.config import ConfigError, check_choice
from bftrec.registry import Registry

MODELS: Registry = Registry("model")

LOSSES = ("ce", "bce", "sampled_softmax")


@dataclass
class DataInfo:
    """Runtime facts from the dataset (never from yaml)."""

    n_items: int                      # N: item ids 1..N, 0 = padding
    train_counts: np.ndarray          # (N + 1,) int64 training counts per item id
    has_timestamps: bool = False


class SeqRecModel(nn.Module):
    """Base class: config validation hooks and the shared loss heads.

    Subclasses set ``Config`` (a dataclass), ``causal`` and implement the three contract methods.
    """

    Config: type = object
    causal: bool = True

    def _init(self, m: nn.Module) -> None:
        """N(0, cfg.init_std) for Linear and Embedding weights, zero biases and padding rows."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                nn.init.zeros_(m.weight[m.padding_idx])

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None) -> torch.Tensor:
        raise NotImplementedError

    def training_loss(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def score_items(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def calibrate(self, batch: dict) -> None:
        """No-grad calibration pass before the first step (BFT.md §1, s₀²); a no-op for standard layers.

        A stack that supports it exposes ``calibration()``, a context manager under which forwards
        set each layer's prior scale from the batch, layer by layer. The pass runs in eval mode (no
        dropout: s₀² is a property of the data, not of a dropout draw); the mode is restored after.
        """
        stack = getattr(self, "stack", None)
        if stack is not None and hasattr(stack, "calibration"):
            was_training = self.training
            self.eval()
            try:
                with torch.no_grad(), stack.calibration():
                    self.training_loss(batch)
            finally:
                self.train(was_training)

    def mechanism(self, batch: dict) -> dict:
        """Per-layer BFT statistics for the scoring positions (BFT.md §6); {} for standard layers."""
        mech: dict = {}
        with torch.no_grad():
            self.encode(batch["item_seq"], batch.get("time"), mech=mech)
        return mech


def check_common(cfg, n_items: int) -> None:
    """Checks shared by all backbones; one-line ConfigError on an impossible setting."""
    if cfg.max_len < 1:
        raise ConfigError(f"model.max_len={cfg.max_len} must be >= 1 (the number of most recent items kept)")
    for key in ("d_model", "n_heads", "d_ff"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"model.{key}={getattr(cfg, key)} must be >= 1")
    if not cfg.init_std > 0:
        raise ConfigError(f"model.init_std={cfg.init_std} must be > 0")
    if not 0.0 <= cfg.attn_dropout < 1.0:
        raise ConfigError(f"model.attn_dropout={cfg.attn_dropout} must be in [0, 1)")
    if cfg.d_model % cfg.n_heads:
        raise ConfigError(f"model.d_model={cfg.d_model} must be divisible by model.n_heads={cfg.n_heads}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.dropout} must be in [0, 1)")
    check_choice(cfg.loss, LOSSES, "model.loss")
    if cfg.loss in ("sampled_softmax", "bce") and cfg.n_negatives < 1:
        raise ConfigError(f"model.n_negatives={cfg.n_negatives} must be >= 1 for loss={cfg.loss}")
    if cfg.loss == "sampled_softmax" and cfg.n_negatives >= n_items:
        raise ConfigError(f"model.n_negatives={cfg.n_negatives} must be < the number of items ({n_items}); "
                          f"use loss=ce for a full softmax")


def next_item_loss(h: torch.Tensor, targets: torch.Tensor, item_emb: torch.Tensor, loss: str,
                   n_negatives: int, n_items: int, bias: Optional[torch.Tensor] = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """Loss of predicting ``targets`` from hidden states, averaged over non-padding positions.

    Args:
        h: (B, L, D) float hidden states.
        targets: (B, L) int64 target item ids, 0 = no target (padding).
        item_emb: (N + 1 (+ specials), D) float output embedding table, tied to the input one.
        loss: ``ce`` full softmax over items 1..N; ``bce`` one uniform negative per position
            (SASRec, Kang & McAuley 2018); ``sampled_softmax`` ``n_negatives`` uniform negatives
            shared by the batch, accidental hits masked.
        bias: optional (N + 1 (+ specials),) output bias (BERT4Rec).
        temperature: logits are divided by it (HSTU's cosine logits).
    Returns:
        scalar float32.
    """
    keep = targets.ne(0)
    h = h[keep]  # (P, D)
    pos = targets[keep]  # (P,)
    if h.numel() == 0:
        return item_emb.sum() * 0.0
    table = item_emb[: n_items + 1]
    b = bias[: n_items + 1] if bias is not None else None
    if loss == "ce":
        logits = h @ table.t()  # (P, N + 1)
        if b is not None:
            logits = logits + b
        logits = logits / temperature
        logits[:, 0] = torch.finfo(logits.dtype).min  # padding is never a class
        return F.cross_entropy(logits.float(), pos)
    if loss == "bce":
        neg = torch.randint(1, n_items + 1, pos.shape, device=pos.device)  # (P,)
        pos_logit = (h * table[pos]).sum(-1)
        neg_logit = (h * table[neg]).sum(-1)
        if b is not None:
            pos_logit, neg_logit = pos_logit + b[pos], neg_logit + b[neg]
        return (F.binary_cross_entropy_with_logits(pos_logit.float(), torch.ones_like(pos_logit, dtype=torch.float))
                + F.binary_cross_entropy_with_logits(neg_logit.float(), torch.zeros_like(neg_logit, dtype=torch.float)))
    # sampled softmax: column 0 is the positive, then shared negatives
    neg = torch.randint(1, n_items + 1, (n_negatives,), device=pos.device)  # (K,)
    pos_logit = (h * table[pos]).sum(-1, keepdim=True)  # (P, 1)
    neg_logit = h @ table[neg].t()  # (P, K)
    if b is not None:
        pos_logit, neg_logit = pos_logit + b[pos, None], neg_logit + b[neg]
    neg_logit = neg_logit.masked_fill(neg[None, :] == pos[:, None], torch.finfo(neg_logit.dtype).min)
    logits = torch.cat([pos_logit, neg_logit], dim=1).float() / temperature  # (P, 1 + K)
    return F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=pos.device))


def full_scores(h_last: torch.Tensor, item_emb: torch.Tensor, n_items: int,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, D) @ (N + 1, D)^T -> (B, N + 1) float32 with padding (column 0) set to -inf."""
    scores = (h_last @ item_emb[: n_items + 1].t()).float()
    if bias is not None:
        scores = scores + bias[: n_items + 1].float()
    scores[:, 0] = float("-inf")
    return scores
