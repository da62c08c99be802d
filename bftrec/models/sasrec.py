"""SASRec: self-attentive sequential recommendation.

Paper: W.-C. Kang and J. McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018.

Item and learned position embeddings, causal Transformer blocks, a final LayerNorm and an output
layer tied to the item embeddings. The stack is built through the single swap point
``bftrec.layers.build_stack``, so ``layer=bft`` gives the BFT twin of the same block (BFT.md).

Deviations from the paper (as in most PyTorch ports, e.g. pmixer/SASRec.pytorch, RecBole):
- Pre-LN blocks, ``h + Attn(LN(h))`` with queries, keys and values all from ``LN(h)``. The original
  adds the residual to the *normalised* query and uses raw ``h`` for keys and values.
- Loss is configurable: ``ce`` (full softmax, default), ``bce`` (one uniform negative per position,
  as in the paper, which samples negatives outside the user's history) or ``sampled_softmax``.
- Embeddings are scaled by sqrt(D) as in the original; initialisation is N(0, 0.02) (BERT-style);
  ``model.init=xavier_normal`` draws every matrix (embeddings, projections, FFN) Xavier normal instead,
  as RecTools does (the eSASRec benchmark, issue 11 item 6); biases stay zero and the BFT τ table keeps
  its own initialisation. ``model.item_dropout`` (default 0, off) drops entries of the item table in
  training, one draw per step shared by the input lookup and the output scores, as RecTools does.
- Positions count from the end of the window (the most recent item is always position ``max_len - 1``);
  the original and RecBole count from the first item kept.

The block, the sqrt(D) scaling and the positions are defaults with a switch each, for the parity
ablation against RecBole's SASRec (issue 11; ``configs/sasrec_convention/``, ``results/sasrec_conventions/``):
``model.block=post_ln`` (RecBole and the original
Transformer: ``LN(item + position)`` then dropout, post-LN blocks ``h = LN(h + drop(Attn(h)))``, no final
LayerNorm; the block is ``BERT4RecBlock`` under a causal mask, so ``layer=bft`` gets its BFT twin),
``model.emb_scale=false`` (no sqrt(D) on the item embedding, as RecBole) and
``model.positions=from_start`` (position 0 = the first item kept, as the original and RecBole).
``model.block=original`` is the original paper's TensorFlow block, as RecTools' ``SASRecTransformerLayer``
ports it (the block behind the eSASRec benchmark's SASRec figures, issue 11 item 6):
``q = LN1(h)``, ``h = q + Attn(queries q, keys and values h)`` (the residual adds the *normalised* query),
``f = LN2(h)``, ``h = f + drop(FFN(f))`` with a ReLU FFN and dropout on its hidden units, then the final
LayerNorm. It has no BFT twin: ``layer=bft`` with it is refused in one line. With it,
``model.key_padding_mask=false`` lets queries attend to the left padding (zeroed inputs, so keys and
values are the projection biases), RecTools' default; ours (true) masks padded keys, as the TF code. Then
outputs depend on how much padding a row has, so they are no longer invariant to extra left padding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from bftrec.config import ConfigError, check_choice
from bftrec.layers import Masks, build_masks, build_stack
from bftrec.models.base import (
    MODELS,
    DataInfo,
    SeqRecModel,
    check_common,
    full_scores,
    next_item_loss,
    next_item_targets,
)
from bftrec.models.blocks import (  # shared with BERT4Rec and HSTU; re-exported here for older imports
    POSITIONS,
    BERT4RecBlock,
    PointWiseFFN,
    SelfAttention,
    position_ids,
)


@dataclass
class SASRecConfig:
    name: str = "sasrec"
    d_model: int = 64          # hidden width D
    n_layers: int = 2          # number of blocks
    n_heads: int = 2           # attention heads H (d = D / H)
    d_ff: int = 256            # point-wise FFN width F
    dropout: float = 0.2       # hidden / embedding dropout
    attn_dropout: float = 0.2  # dropout on attention weights
    max_len: int = 50          # most recent items kept per sequence (L)
    loss: str = "ce"           # ce | bce | sampled_softmax
    n_negatives: int = 256     # negatives for sampled_softmax (see negatives_per)
    negatives_per: str = "batch"  # sampled_softmax: batch (one shared draw) | position (HSTU reference)
    ce_chunk: int = 128        # ce: positions per chunk of the softmax, 0 = materialise (P, N) logits
    init_std: float = 0.02     # N(0, init_std) initialisation (init=normal)
    init: str = "normal"       # normal: N(0, init_std) | xavier_normal: every matrix Xavier normal (RecTools)
    item_dropout: float = 0.0  # item-table dropout in training, one draw per step for input and output (RecTools)
    block: str = "pre_ln"      # pre_ln | post_ln (RecBole: embedding LN, post-LN blocks, no final LN) | original
    emb_scale: bool = True     # multiply the item embedding by sqrt(D) (the original); RecBole does not
    positions: str = "from_end"  # from_end: last item = max_len - 1 | from_start: first item kept = 0 (RecBole)
    key_padding_mask: bool = True  # False: padded keys stay attendable (RecTools' default; block=original only)


BLOCKS = ("pre_ln", "post_ln", "original")
INITS = ("normal", "xavier_normal")


class SASRecBlock(nn.Module):
    """Pre-LN causal block: ``h' = h + drop(Attn(LN1 h))``, ``h'' = h' + drop(FFN(LN2 h'))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, attn_dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = PointWiseFFN(d_model, d_ff)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, masks: Masks, last_only: bool = False, **ctx) -> torch.Tensor:
        """h (B, L, D) -> (B, L, D), or (B, 1, D) for the last position only with ``last_only``."""
        a = self.attn(self.ln1(h), masks, last_only)  # (B, L or 1, D)
        h = (h[:, -1:] if last_only else h) + self.drop(a)
        return h + self.drop(self.ffn(self.ln2(h)))


class OriginalSASRecBlock(nn.Module):
    """The original SASRec block (Kang & McAuley's TensorFlow code, as RecTools' ``SASRecTransformerLayer``):
    ``q = LN1 h``, ``h' = q + Attn(queries q, keys and values h)``, ``f = LN2 h'``, ``h'' = f + drop(FFN(f))``,
    FFN with ReLU and dropout on its hidden units. Attention dropout acts on the weights only.

    Padded positions are zeroed on entry (``masks.valid``; the TF code's and RecTools' timeline mask), so
    a padded key or value is the projection's bias alone. By default attention never reaches padded keys
    (``masks.attn``, as in the original TensorFlow code); ``model.key_padding_mask=false`` lets every
    query attend to them, as RecTools' default ``use_key_padding_mask=False`` does (``SASRec.encode``).
    The final LayerNorm keeps torch's eps 1e-5 (RecTools: 1e-8)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, attn_dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = PointWiseFFN(d_model, d_ff, act="relu", dropout=dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, masks: Masks, last_only: bool = False, **ctx) -> torch.Tensor:
        """h (B, L, D) -> (B, L, D), or (B, 1, D) for the last position only with ``last_only``."""
        h = h * masks.valid.unsqueeze(-1)  # (B, L, D): padding zeroed before every block
        q = self.ln1(h)  # (B, L, D)
        h = (q[:, -1:] if last_only else q) + self.attn(q, masks, last_only, kv=h)  # (B, L or 1, D)
        f = self.ln2(h)
        return f + self.drop(self.ffn(f))


@MODELS.register("sasrec")
class SASRec(SeqRecModel):
    """SASRec backbone (Kang & McAuley, ICDM 2018): causal next-item model, scores tied to the item table.

    Raises:
        ConfigError: bad ``block``, ``positions``, ``init``, ``item_dropout`` outside [0, 1),
            ``key_padding_mask=false`` without ``block=original``, ``block=original`` with a BFT layer,
            or a shared check (``check_common``) fails.
    """

    Config = SASRecConfig
    causal = True
    prefix_training = True

    def __init__(self, cfg: SASRecConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        check_choice(cfg.block, BLOCKS, "model.block")
        check_choice(cfg.positions, POSITIONS, "model.positions")
        check_choice(cfg.init, INITS, "model.init")
        if not 0.0 <= cfg.item_dropout < 1.0:
            raise ConfigError(f"model.item_dropout={cfg.item_dropout} must be in [0, 1) (0 = off, the default)")
        if not cfg.key_padding_mask and cfg.block != "original":
            raise ConfigError(f"model.key_padding_mask=false needs model.block=original (RecTools' block, "
                              f"which zeroes padding before every block), not {cfg.block}; set both or neither")
        if cfg.block == "original" and getattr(layer_cfg, "name", "standard") != "standard":
            raise ConfigError(f"model.block=original has no BFT twin (layer={layer_cfg.name}); use "
                              "layer=standard with it, or model.block=pre_ln or post_ln with a BFT layer")
        self.cfg, self.n_items = cfg, info.n_items
        D = cfg.d_model
        self.item_emb = nn.Embedding(info.n_items + 1, D, padding_idx=0)
        self.pos_emb = nn.Embedding(cfg.max_len, D)
        self.emb_drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)
        if cfg.init == "xavier_normal":  # before build_stack: the BFT prior reads input_variance()
            self.xavier_normal_matrices(self)
        block_cls = OriginalSASRecBlock if cfg.block == "original" else SASRecBlock
        if cfg.block == "post_ln":
            block_cls, self.emb_ln = BERT4RecBlock, nn.LayerNorm(D)
        self.stack = build_stack(
            layer_cfg, block_cls, cfg.n_layers, n_tokens=info.n_items + 1,
            precision_ctx={"input_variance": self.input_variance(), "train_counts": info.train_counts,
                           "pad_id": 0},
            d_model=D, n_heads=cfg.n_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout)
        for block in self.stack.blocks:  # not the stack itself: the BFT τ table keeps its own init
            block.apply(self._init)
            if cfg.init == "xavier_normal":
                self.xavier_normal_matrices(block)
        if cfg.block != "post_ln":
            self.final_ln = nn.LayerNorm(D)

    @torch.no_grad()
    def input_variance(self) -> float:
        """Mean per-coordinate variance of the layer-0 input (item + position embedding) at init;
        with ``block=post_ln`` of ``LN(item + position)``, each item paired with position ``id mod max_len``."""
        x = self.item_emb.weight[1:] * (math.sqrt(self.cfg.d_model) if self.cfg.emb_scale else 1.0)  # (N, D)
        if self.cfg.block == "post_ln":
            ids = torch.arange(1, self.n_items + 1)
            return float(self.emb_ln(x + self.pos_emb(ids % self.cfg.max_len)).var(dim=0).mean())
        return float(x.var(dim=0).mean() + self.pos_emb.weight.var(dim=0).mean())

    def item_table(self) -> torch.Tensor:
        """The (N + 1, D) float item table of one step: ``item_emb.weight``, or in training with
        ``model.item_dropout > 0`` one dropout draw of it, which the step's input lookup and output
        scores share (RecTools' ``IdEmbeddingsItemNet``, the eSASRec benchmark's SASRec; issue 11 item 6)."""
        w = self.item_emb.weight
        return F.dropout(w, self.cfg.item_dropout, self.training) if self.cfg.item_dropout else w

    def item_embedding(self, item_seq: torch.Tensor, table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """item_seq (B, L) int64 -> (B, L, D) float item embedding ``e_x · sqrt(D)`` (``e_x`` with
        ``emb_scale=false``), no position, no dropout; ``table`` (N + 1, D): look up there instead of
        ``item_emb`` (``item_table``'s draw).

        What the BFT stack's τ MLP reads (``tau_input``, BFT.md §0: positions add no precision).
        """
        x = self.item_emb(item_seq) if table is None else F.embedding(item_seq, table, padding_idx=0)
        return x * math.sqrt(self.cfg.d_model) if self.cfg.emb_scale else x

    def embed(self, item_seq: torch.Tensor, table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded -> (B, L, D). ``positions=from_end``: the last column is
        position max_len - 1; ``from_start``: each row's first item is position 0; ``table``: as in
        ``item_embedding``."""
        pos = self.pos_emb(position_ids(item_seq, self.cfg.max_len, self.cfg.positions))  # (1 or B, L, D)
        h = self.item_embedding(item_seq, table) + pos
        if self.cfg.block == "post_ln":
            h = self.emb_ln(h)
        return self.emb_drop(h) * item_seq.ne(0).unsqueeze(-1)

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None, last_only: bool = False,
               table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded, L <= max_len -> (B, L, D) hidden states; with
        ``last_only`` the last block may return the last position alone, (B, 1, D) (``Stack``);
        ``table``: the step's item table (``item_table``), None = ``item_emb``."""
        item_seq = item_seq[:, -self.cfg.max_len:]
        masks = build_masks(item_seq, causal=True, key_padding=self.cfg.key_padding_mask)
        tau_input = self.item_embedding if table is None else (lambda seq: self.item_embedding(seq, table))
        h = self.stack(self.embed(item_seq, table), item_seq, masks, mech=mech, tau_input=tau_input,
                       last_only=last_only)
        return h if self.cfg.block == "post_ln" else self.final_ln(h)

    def training_loss(self, batch: dict) -> torch.Tensor:
        """Next-item loss at every position (``batch["last_target_only"]``: the last one only):
        ``batch["seq"]`` (B, L + 1) int64, inputs seq[:, :-1], targets seq[:, 1:]."""
        inputs, targets = next_item_targets(batch["seq"], batch.get("last_target_only", False))  # (B, L) each
        table = self.item_table()  # (N + 1, D): one draw for the input lookup and the output scores
        h = self.encode(inputs, table=table, last_only=batch.get("last_position_only", False))  # (B, L or 1, D)
        targets = targets[:, -h.shape[1]:]  # (B, 1) when the last block computed the last position alone
        return next_item_loss(h, targets, table, self.cfg.loss, self.cfg.n_negatives,
                              self.n_items, ce_chunk=self.cfg.ce_chunk,
                              negatives_per=self.cfg.negatives_per)

    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, L) history -> (B, N + 1) float32 scores of the next item; column 0 is -inf.

        In eval mode the last block computes the last position only (``Stack``'s ``last_only``); in
        training mode every position, so dropout draws what ``encode`` draws."""
        h = self.encode(batch["item_seq"], last_only=not self.training)[:, -1]  # (B, D); shortcut in eval only
        return full_scores(h, self.item_emb.weight, self.n_items)
