"""GRU4Rec (``model=gru4rec``): a recurrent session recommender (Hidasi et al., ICLR 2016), trained with a
full-softmax cross-entropy over all items, as the strongest reruns of it do (Hidasi & Czapp, "The effect of
third party implementations on reproducibility", RecSys 2023).

Item embedding (dropout) -> ``n_layers`` GRU layers of width ``d_model`` -> dropout -> scores against the
item embedding table (tied input and output embeddings). The next-item loss is the shared one
(``next_item_loss``: ``ce``, ``bce`` or ``sampled_softmax``) at every position, or at the last one under
``trainer.train_windows=prefixes``.

Left padding never reaches the GRU: each row is shifted so that its items come first, run as a packed
sequence, and shifted back, so extra left padding changes no state (the contract's padding invariance).

Deviations from the paper: session-parallel mini-batches are replaced by the trainer's per-user windows
(the last ``max_len + 1`` training items, or every prefix); the loss is CE rather than BPR-max/TOP1-max;
embeddings are tied. There are no Transformer layers, so only ``layer=standard`` exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bftrec.config import ConfigError
from bftrec.models.base import (
    MODELS,
    DataInfo,
    SeqRecModel,
    check_common,
    check_standard_layer_only,
    full_scores,
    next_item_loss,
    next_item_targets,
)


@dataclass
class GRU4RecConfig:
    name: str = "gru4rec"
    d_model: int = 64          # embedding and GRU hidden width D
    n_layers: int = 1          # stacked GRU layers
    n_heads: int = 1           # unused (every model has the common fields)
    d_ff: int = 1              # unused
    dropout: float = 0.25      # dropout on the input embeddings and on the GRU output
    attn_dropout: float = 0.0  # unused
    max_len: int = 50          # most recent items kept per sequence
    loss: str = "ce"           # ce | bce | sampled_softmax
    n_negatives: int = 100     # negatives for sampled_softmax / bce
    init_std: float = 0.02     # N(0, init_std) for the item embeddings
    ce_chunk: int = 128        # positions per chunk of the full softmax (0 = one (P, N) block)
    negatives_per: str = "batch"  # sampled softmax: one negative draw per batch | position


def right_align(item_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, L) -> the gather index that moves each row's items to the front, and the lengths (B,).
    ``x.gather(1, idx)`` right-aligns a (B, L) tensor; ``left_index`` undoes it."""
    B, L = item_seq.shape
    lengths = item_seq.ne(0).sum(1)  # (B,)
    idx = (torch.arange(L, device=item_seq.device)[None] + (L - lengths)[:, None]) % L  # (B, L)
    return idx, lengths


def left_index(lengths: torch.Tensor, L: int) -> torch.Tensor:
    """(B, L) gather index that moves right-aligned rows of ``lengths`` items back to the right end."""
    return (torch.arange(L, device=lengths.device)[None] - (L - lengths)[:, None]) % L


@MODELS.register("gru4rec")
class GRU4Rec(SeqRecModel):
    Config = GRU4RecConfig
    causal = True
    prefix_training = True
    standard_layer_only = True  # no Transformer layers: refused before any data is read

    def __init__(self, cfg: GRU4RecConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        check_standard_layer_only(cfg.name, layer_cfg)  # no Transformer layers: layer=standard only
        if cfg.n_layers < 1:
            raise ConfigError(f"model.n_layers={cfg.n_layers} must be >= 1 (stacked GRU layers)")
        self.cfg, self.n_items = cfg, info.n_items
        self.item_emb = nn.Embedding(info.n_items + 1, cfg.d_model, padding_idx=0)
        self.gru = nn.GRU(cfg.d_model, cfg.d_model, num_layers=cfg.n_layers, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)
        nn.init.normal_(self.item_emb.weight, std=cfg.init_std)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None, last_only: bool = False) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded -> (B, L, D) float32 GRU states (0 on padding); the GRU never
        sees the padding (packed sequences), so left padding changes nothing."""
        item_seq = item_seq[:, -self.cfg.max_len:]
        B, L = item_seq.shape
        idx, lengths = right_align(item_seq)  # (B, L), (B,)
        x = self.drop(self.item_emb(item_seq.gather(1, idx)))  # (B, L, D), items first
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=L)  # (B, L, D), items first
        back = left_index(lengths, L)[..., None].expand(-1, -1, out.shape[-1])  # (B, L, D)
        h = out.gather(1, back) * item_seq.ne(0)[..., None]  # (B, L, D), items at the right end again
        return self.drop(h)

    def training_loss(self, batch: dict) -> torch.Tensor:
        """Next-item loss at every position (``batch["last_target_only"]``: the last one only):
        ``batch["seq"]`` (B, L + 1) int64, inputs seq[:, :-1], targets seq[:, 1:]."""
        inputs, targets = next_item_targets(batch["seq"], batch.get("last_target_only", False))  # (B, L) each
        return next_item_loss(self.encode(inputs), targets, self.item_emb.weight, self.cfg.loss,
                              self.cfg.n_negatives, self.n_items, ce_chunk=self.cfg.ce_chunk,
                              negatives_per=self.cfg.negatives_per)

    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, N + 1) float32 scores of every item after ``batch["item_seq"]`` (B, L) int64; column 0 -inf."""
        return full_scores(self.encode(batch["item_seq"])[:, -1], self.item_emb.weight, self.n_items)
