"""A toy backbone that proves the three-file recipe of docs/ADD_A_BACKBONE.md.

1. this model file: a config dataclass, a native block and the model, registered by name;
2. one import line (in ``bftrec/models/__init__.py`` for a real backbone; here the contract test
   loads this file under a scoped registry, ``tests/test_contract.py::toy_cls``);
3. one yaml, ``tests/configs/model/toy.yaml``, keys exactly the dataclass fields.

``tests/test_add_a_backbone.py`` also follows the doc to the letter with this file: in a copy of the
repository it becomes ``bftrec/models/toy.py``, gets the doc's import line and its yaml in ``configs/model/``,
and the contract and loss suites, ruff and ``bftrec-train model=toy debug=smoke`` must pass.

The model: item + position embeddings, ``n_layers`` causal mean-pooling blocks built through the
single swap point ``build_stack``, a final LayerNorm and an output layer tied to the item embeddings.
Not a real recommender; it exists only for the tests. It has no BFT variant, so ``layer=bft`` pairs
are expected failures (``build_stack`` raises "not available").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from bftrec.layers import Masks, build_masks, build_stack
from bftrec.models.base import MODELS, DataInfo, SeqRecModel, check_common, full_scores, next_item_loss


@dataclass
class ToyConfig:
    name: str = "toy"
    d_model: int = 16          # hidden width D
    n_layers: int = 1          # number of blocks
    n_heads: int = 1           # unused (kept: every backbone has the common fields)
    d_ff: int = 32             # unused (kept: every backbone has the common fields)
    dropout: float = 0.1       # dropout on the block output and the embeddings
    attn_dropout: float = 0.0  # unused
    max_len: int = 8           # most recent items kept per sequence
    loss: str = "ce"           # ce | bce | sampled_softmax
    n_negatives: int = 8       # negatives for sampled_softmax
    init_std: float = 0.02     # N(0, init_std) initialisation
    ce_chunk: int = 128        # positions per chunk of the full softmax (0 = one (P, N) block)
    negatives_per: str = "batch"  # sampled softmax: one negative draw per batch | position


class ToyBlock(nn.Module):
    """``h' = h + drop(out(mean_{j allowed} LN1(h)_j))``: causal mean pooling, one linear map.

    Submodules: ``ln1``, ``out``. Uses ``masks.attn`` (B, 1, L, L) bool, True = may attend.
    """

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, masks: Masks, **ctx) -> torch.Tensor:
        w = masks.attn[:, 0].to(h.dtype)  # (B, 1, L, L) -> (B, L, L)
        w = w / w.sum(-1, keepdim=True).clamp(min=1)  # an all-padding row stays all 0
        return h + self.drop(self.out(w @ self.ln1(h)))  # (B, L, L) @ (B, L, D) -> (B, L, D)


@MODELS.register("toy")
class ToyBackbone(SeqRecModel):
    Config = ToyConfig
    causal = True

    def __init__(self, cfg: ToyConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        self.cfg, self.n_items = cfg, info.n_items
        self.item_emb = nn.Embedding(info.n_items + 1, cfg.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        for emb in (self.item_emb, self.pos_emb):
            nn.init.normal_(emb.weight, std=cfg.init_std)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = build_stack(layer_cfg, ToyBlock, cfg.n_layers, n_tokens=info.n_items + 1,
                                 precision_ctx={"input_variance": cfg.init_std ** 2,
                                                "train_counts": info.train_counts, "pad_id": 0},
                                 d_model=cfg.d_model, dropout=cfg.dropout)
        self.final_ln = nn.LayerNorm(cfg.d_model)

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None) -> torch.Tensor:
        """item_seq (B, L) int64 left-padded -> (B, L', D) float, L' = min(L, max_len)."""
        item_seq = item_seq[:, -self.cfg.max_len:]
        L = item_seq.shape[1]
        pos = torch.arange(self.cfg.max_len - L, self.cfg.max_len, device=item_seq.device)  # (L,)
        h = self.drop(self.item_emb(item_seq) + self.pos_emb(pos)[None]) * item_seq.ne(0).unsqueeze(-1)
        h = self.stack(h, item_seq, build_masks(item_seq, causal=True), mech=mech, tau_input=self.item_emb)
        return self.final_ln(h)

    def training_loss(self, batch: dict) -> torch.Tensor:
        seq = batch["seq"]  # (B, L + 1)
        inputs, targets = seq[:, :-1], seq[:, 1:] * seq[:, :-1].ne(0)  # (B, L) each
        return next_item_loss(self.encode(inputs), targets, self.item_emb.weight, self.cfg.loss,
                              self.cfg.n_negatives, self.n_items, ce_chunk=self.cfg.ce_chunk,
                              negatives_per=self.cfg.negatives_per)

    def score_items(self, batch: dict) -> torch.Tensor:
        return full_scores(self.encode(batch["item_seq"])[:, -1], self.item_emb.weight, self.n_items)
