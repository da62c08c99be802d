"""Building blocks shared by the backbones: learned-position ids, mask-driven multi-head attention, the
point-wise FFN and the post-LN (BERT) block.

SASRec (``model.block=post_ln``) and BERT4Rec use the post-LN block; SASRec's pre-LN and original blocks
and HSTU's block live in their own model files. Attention is causal or bidirectional by the mask it is
given (``bftrec.layers.Masks``), never by its own code. Shapes: (B, L, D) float hidden states, (B, L)
int64 item ids, H heads of width d = D / H.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from bftrec.config import check_choice
from bftrec.layers import Masks, masked_softmax

POSITIONS = ("from_end", "from_start")


def position_ids(item_seq: torch.Tensor, max_len: int, positions: str) -> torch.Tensor:
    """Learned-position ids of a left-padded ``item_seq`` (B, L) int64, L <= max_len: ``from_end`` -> (1, L)
    int64, the last column max_len - 1; ``from_start`` -> (B, L) int64, each row's first non-padding token 0
    (padding gets 0 too; callers zero it). Shared by SASRec, BERT4Rec and HSTU (``model.positions``)."""
    L = item_seq.shape[1]
    if positions == "from_end":
        return torch.arange(max_len - L, max_len, device=item_seq.device)[None]  # (1, L)
    return (item_seq.ne(0).cumsum(1) - 1).clamp(min=0)  # (B, L)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention with an explicit boolean mask (True = may attend).

    Causal or bidirectional is decided by the mask it receives (SASRec: causal; BERT4Rec: padding only).
    """

    def __init__(self, d_model: int, n_heads: int, attn_dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(attn_dropout)

    def heads(self, x: torch.Tensor, kv: Optional[torch.Tensor] = None, last_only: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q (B, H, Tq, d), k, v each (B, H, T, d): Tq = T, or 1 with ``last_only`` (the last
        position's query alone is projected). With ``kv`` (B, T, D), keys and values come from it and queries
        from ``x`` (the original SASRec block), through the same projection weights."""
        B, T, D = x.shape
        if kv is None and not last_only:
            q, k, v = self.qkv(x).split(D, dim=-1)  # 3 x (B, T, D)
        else:
            w, b = self.qkv.weight, self.qkv.bias  # (3D, D), (3D,): rows q | k | v
            q = F.linear(x[:, -1:] if last_only else x, w[:D], b[:D])  # (B, Tq, D)
            k, v = F.linear(x if kv is None else kv, w[D:], b[D:]).split(D, dim=-1)  # 2 x (B, T, D)
        d = D // self.n_heads
        return tuple(t.reshape(B, t.shape[1], self.n_heads, d).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)

    def forward(self, x: torch.Tensor, masks: Masks, last_only: bool = False,
                kv: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T', D): T' = T, or 1 with ``last_only`` (only the last position queries;
        keys and values are still every position). ``kv`` (B, T, D): keys and values from it (``heads``).

        Training uses ``masked_softmax`` and ``nn.Dropout`` (the reference). In eval mode the same
        attention goes through torch's fused ``scaled_dot_product_attention`` (equal to float32
        rounding, tests/test_contract.py), a query with no allowed key giving 0 as ``masked_softmax``.
        """
        q, k, v = self.heads(x, kv, last_only)  # q (B, H, 1, d) with last_only
        allowed = masks.attn
        if last_only:
            allowed = allowed[:, :, -1:]  # (B, 1, 1, T)
        if self.training:
            logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T', T)
            m = self.attn_drop(masked_softmax(logits, allowed)) @ v  # (B, H, T', d)
        else:
            m = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T', d)
            # torch 2.13's CPU kernel already gives 0 on a row with no allowed key; older kernels give NaN
            m = torch.where(allowed.any(-1, keepdim=True), m, 0.0)
        B, H, T, d = m.shape
        return self.out(m.transpose(1, 2).reshape(B, T, H * d))  # (B, H, T', d) -> (B, T', D)


class PointWiseFFN(nn.Module):
    """FFN(y) = W2 GELU(W1 y + b1) + b2 (BFT.md §3 names: w1, w2); ``act="relu"`` and ``dropout`` on the
    hidden units give the original SASRec FFN ``W2 drop(ReLU(W1 y + b1)) + b2``."""

    def __init__(self, d_model: int, d_ff: int, act: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        check_choice(act, ("gelu", "relu"), "PointWiseFFN act")
        self.act = nn.ReLU() if act == "relu" else nn.GELU()
        self.hidden_drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()  # default: no op, no RNG draw

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.w2(self.hidden_drop(self.act(self.w1(y))))


class BERT4RecBlock(nn.Module):
    """Post-LN bidirectional block (BERT): ``h' = LN1(h + drop(Attn(h)))``, ``h'' = LN2(h' + drop(FFN(h')))``.

    Submodules: ``attn.qkv``, ``attn.out``, ``ln1``, ``ffn.w1``, ``ffn.w2``, ``ln2``. Note that in this
    post-LN block ``ln1`` follows attention and ``ln2`` follows the FFN (BFT.md §2/§3 post-LN rules).
    ``masks.attn`` is the padding mask only (``causal=False``); the block never builds masks.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float) -> None:
        super().__init__()
        self.attn = SelfAttention(d_model, n_heads, attn_dropout)
        self.ln1 = nn.LayerNorm(d_model)
        self.ffn = PointWiseFFN(d_model, d_ff)
        self.ln2 = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, masks: Masks, last_only: bool = False, **ctx) -> torch.Tensor:
        """h (B, L, D) float -> (B, L, D), or (B, 1, D) for the last position only with ``last_only``;
        ``ctx`` (e.g. HSTU's ``time_bucket``) is unused."""
        a = self.attn(h, masks, last_only)  # (B, L or 1, D)
        h = self.ln1((h[:, -1:] if last_only else h) + self.drop(a))
        return self.ln2(h + self.drop(self.ffn(h)))
