"""HSTU: Hierarchical Sequential Transduction Units (pointwise, gated, causal attention).

Paper: J. Zhai, L. Liao, X. Liu, Y. Wang, R. Li, X. Cao, L. Gao, Z. Gong, F. Gu, M. He, Y. Lu and
Y. Shi, "Actions Speak Louder than Words: Trillion-Parameter Sequential Transducers for Generative
Recommendations", ICML 2024. Reference: meta-recsys/generative-recommenders,
``generative_recommenders/research/modeling/sequential/hstu.py`` with its embedding, input
preprocessor, L2-norm postprocessor and sampled-softmax modules, recipe
``configs/ml-1m/hstu-sampled-softmax-n128-final.gin`` (the traditional sequential setting, Section
4.1.1). This is an independent re-implementation on dense left-padded tensors.

One HSTU block (no separate FFN)::

    x          = LN1(h)
    u, v, q, k = SiLU(x W_uvqk)                      # no bias; each (B, T, D); q, k, v split into H heads
    w_tj       = SiLU(q_t . k_j + rab_tj) / N_t      # pointwise, NOT normalised; 0 where masked
    m          = dropout_attn(w) @ v                 # (B, T, D), heads concatenated
    h'         = h + f2(dropout(LN2(m) * u))         # U gating, then the output projection f2

``rab_tj`` = a learned bias per relative position ``t - j`` (clipped at ``max_len - 1``) plus, when
the data has timestamps, a learned bias per bucket ``floor(ln(max(|τ_t - τ_j|, 1)) / 0.301)``
(clipped at ``n_time_buckets``), shared by the heads; each block has its own tables (the buckets
themselves are computed once per forward, ``HSTU.block_context``). ``N_t`` is the
fixed ``max_len`` (``attn_norm=max_len``) or the number of keys position ``t`` may see
(``attn_norm=valid``). Embedding: ``item_emb * sqrt(D) + pos_emb`` with dropout; output: the last
block's states, L2-normalised (eps 1e-6). Items are scored by cosine similarity; the training loss
divides cosines by ``temperature`` (sampled softmax over uniform negatives by default).

Initialisation and eps as the reference: item embeddings truncated N(0, init_std) at ±2σ
(init_std = 0.02 there), position embeddings truncated N(0, 1/D) at ±2σ, ``W_uvqk`` N(0, init_std),
``rab`` tables N(0, init_std), ``f2`` Xavier-uniform weight and PyTorch's default bias; LN1 and LN2
eps 1e-6. At init ``m`` is tiny (per-token Var_D(m) ~1e-8 on MovieLens windows, against eps 1e-6;
``results/diag/hstu_init_stats.py``), so LN2 starts as a gain ``~1/sqrt(eps)`` rather than a
normaliser, in the reference as here.

Deviations from the reference implementation, each deliberate:
- Left-padded dense tensors with an explicit causal ∧ key-valid mask instead of jagged tensors
  (the reference zeroes padded v instead: the same output). Positions are counted from the right
  by default (``model.positions=from_end``: last column = ``max_len - 1``), the default of every
  backbone here, so the scoring position always has the same embedding; the reference counts from
  the oldest item of the window, ``model.positions=from_start`` (the two agree for windows of
  ``max_len`` items; on ML-1M, results/hstu_positions_ml1m).
- The time gap of key ``j`` is measured from the *query's own* timestamp ``τ_t``. The reference
  uses the timestamp of the item *after* the query (the target's time at the last position), which
  the history windows here do not carry; ours never reads a target's timestamp. Without
  timestamps (``time_bias=false``) the position bias is kept; the reference then drops ``rab``
  altogether (its ML-1M copy has timestamps, ours has not).
- ``N_t = max_len``: the reference divides by its padded width ``max_len + 11`` (10 generative
  output slots + 1, never trained on here), a constant 5% smaller at ``max_len = 200``.
- The relative position table holds ``max_len`` entries (distances 0..max_len-1, the causal half);
  the reference keeps ``2 (max_len + 11) - 1`` entries, the rest masked away. Same function.
- LN1 and LN2 have learned affine parameters (γ = 1, β = 0 at init, so equal to the reference's
  non-affine norms at init): BFT.md §4 reads LN2's γ, and the BFT twin must share this block.
- ``attn_dropout`` is applied to the pointwise weights (the reference accepts but never applies it;
  default 0.0 here for that reason). ``dropout`` acts on ``LN2(m) * u`` and on the embeddings, one
  rate for both (the recipe sets both to 0.2).
- One width ``d_model`` for q/k and for u/v (the reference allows separate ``attention_dim`` and
  ``linear_dim``; the recipe sets both to D = 50). ``d_ff`` is unused (HSTU has no FFN); it exists
  so the shared ``debug=smoke`` overrides apply to every backbone.
- ``loss=ce`` (full softmax over all cosines / temperature) is offered beside the reference's
  sampled softmax; ``bce`` is rejected (the shared bce head ignores the temperature). The shared
  sampled-softmax head (``bftrec.models.base.next_item_loss``) draws ``n_negatives`` uniform
  negatives per position with ``negatives_per=position``, as the reference does; the main grid's
  tuned configs set it. The schema default stays ``batch`` (one draw shared by the batch): runs
  written before the key existed used it, and it is cheaper on the CPU (a (P, D) x (D, K)
  matmul; ``position`` takes a memory-bound (P, K, D) gather, or a dense matmul and column gather
  on catalogues of at most ``DENSE_NEGATIVES_RATIO`` x K rows: ``base.per_position_logits``).
  On ml-100k ``position`` gains +35% validation NDCG@10 (``results/hstu_negatives``).
- Training protocol (``bftrec.trainer``): the reference trains 101 epochs with AdamW(lr 1e-3,
  betas (0.9, 0.98), weight decay 0) on everything but the test item and has no validation split;
  here the validation item is held out and the best validation epoch is kept (early stopping).
  ``trainer.betas`` sets the betas (torch's (0.9, 0.999) by default; the main grid's tuned HSTU
  configs set the reference's (0.9, 0.98)).
- Evaluation protocol (``bftrec.evaluation``): the reference excludes from the full ranking only the
  items of the scored window (its last ``max_len``, ``invalid_ids=past_ids`` in
  ``research/data/eval.py``), so a longer history's older items stay candidates (26% of ML-1M's test
  users have more than 200 history items, results/hstu_time_bias_ml1m); here the whole history is
  excluded by default, and ``eval.exclude_scope=window`` scores as the reference.
"""
from __future__ import annotations

import functools
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
from bftrec.models.blocks import POSITIONS, position_ids

ATTN_NORMS = ("max_len", "valid")
TIME_BUCKET_DIVISOR = 0.301  # reference bucketisation: floor(ln(max(|Δt|, 1)) / 0.301)
LN_EPS = 1e-6  # LN1 and LN2 eps of the reference (SequentialTransductionUnitJagged epsilon)


@dataclass
class HSTUConfig:
    name: str = "hstu"
    d_model: int = 64               # hidden width D (also the q/k and u/v width)
    n_layers: int = 2               # number of HSTU blocks
    n_heads: int = 1                # attention heads H (d = D / H)
    d_ff: int = 256                 # unused: HSTU has no FFN (kept for the shared overrides)
    dropout: float = 0.2            # embedding dropout and dropout on LN2(m) * u
    attn_dropout: float = 0.0       # dropout on the pointwise attention weights
    max_len: int = 50               # most recent items kept per sequence (L)
    loss: str = "sampled_softmax"   # sampled_softmax | ce, over cosine / temperature
    n_negatives: int = 128          # uniform negatives for sampled_softmax (see negatives_per)
    negatives_per: str = "batch"    # sampled_softmax: batch (one shared draw) | position (HSTU reference)
    ce_chunk: int = 128             # ce: positions per chunk of the softmax, 0 = materialise (P, N)
    init_std: float = 0.02          # std of item embeddings (truncated), W_uvqk and rab (reference: 0.02)
    attn_norm: str = "max_len"      # max_len (reference) | valid: divide SiLU weights by this count
    time_bias: bool = True          # add the bucketed log time-gap bias (needs timestamps)
    n_time_buckets: int = 128       # time-gap buckets (the bias table has n_time_buckets + 1 rows)
    temperature: float = 0.05       # logits = cosine / temperature in the training loss
    positions: str = "from_end"     # from_end: last column = max_len - 1 | from_start: first item kept = 0 (reference)


def _reference_buckets(gap: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """The reference's formula, evaluated per pair: ``floor(ln(max(|gap|, 1)) / 0.301)`` clipped to
    ``[0, n_buckets]`` (int64). ``time_buckets`` gives the same integers from precomputed boundaries."""
    return (gap.abs().clamp(min=1).double().log() / TIME_BUCKET_DIVISOR).long().clamp(0, n_buckets)


@functools.lru_cache(maxsize=8)
def _bucket_starts(n_buckets: int) -> torch.Tensor:
    """(min(n_buckets, 142),) int64: the smallest gap in seconds of each bucket 1, 2, ... under the
    reference's formula, found by bisection on ``_reference_buckets`` itself (buckets above 142 start
    beyond 2^62 s, and are left out)."""
    b = torch.arange(1, min(n_buckets, 142) + 1)  # (n,) int64
    guess = torch.exp(b.double() * TIME_BUCKET_DIVISOR).long()  # within float64 rounding of the start
    lo = (guess - guess // 2**20 - 4).clamp(min=1)  # bucket(lo) < b <= bucket(hi), checked
    hi = guess + guess // 2**20 + 4
    if (_reference_buckets(lo, n_buckets) >= b).any() or (_reference_buckets(hi, n_buckets) < b).any():
        raise RuntimeError("time-bucket starts not bracketed by exp(0.301 b) +- 1e-6")
    while (hi - lo > 1).any():
        mid = (lo + hi) // 2
        up = _reference_buckets(mid, n_buckets) >= b
        hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
    return hi


def time_buckets(gap: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """The reference's bucket of a time gap: ``floor(ln(max(|gap|, 1)) / 0.301)``, clipped to
    ``[0, n_buckets]``. ``gap``: int64 seconds, any shape; returns int64 of the same shape.

    Computed as the number of bucket starts at or below ``|gap|`` (``torch.bucketize`` on the integer
    starts of ``_bucket_starts``): the same integers as the formula for any gap below 2^62 s, without a
    float64 logarithm per pair of a (B, T, T) table.
    """
    if gap.is_floating_point():
        raise TypeError(f"time gaps must be integer seconds (int64), got {gap.dtype}; cast the timestamps with .long()")
    starts = _bucket_starts(n_buckets).to(gap.device, copy=True)  # a copy: the cached starts stay untouched
    return torch.bucketize(gap.abs(), starts, right=True)


class RelativeBias(nn.Module):
    """``rab_tj`` = ``pos_w[min(t - j, max_len - 1)]`` (+ ``time_w[bucket(τ_t - τ_j)]``).

    Parameters: ``pos_w`` (max_len,) float; ``time_w`` (n_time_buckets + 1,) float, only when
    ``n_time_buckets > 0``.
    """

    def __init__(self, max_len: int, n_time_buckets: int, init_std: float) -> None:
        super().__init__()
        self.max_len, self.n_time_buckets = max_len, n_time_buckets
        self.pos_w = nn.Parameter(torch.randn(max_len) * init_std)
        self.time_w = nn.Parameter(torch.randn(n_time_buckets + 1) * init_std) if n_time_buckets > 0 else None

    def forward(self, T: int, time_bucket: Optional[torch.Tensor], device: torch.device,
                Tq: Optional[int] = None) -> torch.Tensor:
        """-> (1 or B, 1, Tq, T) float bias of the last ``Tq`` query positions (default all T) over all T keys;
        ``time_bucket`` (B, T, T) int64 (``HSTU.block_context``) or None. Only the rows asked for are
        gathered (scoring: Tq = 1)."""
        Tq = T if Tq is None else Tq
        idx = torch.arange(T, device=device)
        dist = (idx[T - Tq:, None] - idx[None, :]).clamp(0, self.max_len - 1)  # (Tq, T); t < j is masked anyway
        bias = self.pos_w[dist][None, None]  # (1, 1, Tq, T)
        if self.time_w is not None:
            if time_bucket is None:
                raise ValueError("hstu with model.time_bias=true needs time_bucket, from "
                                 "HSTU.block_context(batch['time'] (B, L) int64)")
            bias = bias + self.time_w[time_bucket[:, T - Tq:]][:, None]  # (B, Tq, T) -> (B, 1, Tq, T)
        return bias


class PointwiseAttention(nn.Module):
    """HSTU's pointwise aggregated attention with U gating inputs.

    Parameters (BFT.md §4 names): ``uvqk`` (D -> 4D without bias, u|v|q|k concatenated, SiLU applied
    to all; weight N(0, init_std)), ``rab`` (``RelativeBias``). ``weights`` gives the undropped
    pointwise weights ``w`` so that a BFT twin can reuse it.
    """

    def __init__(self, d_model: int, n_heads: int, attn_dropout: float, max_len: int, attn_norm: str,
                 n_time_buckets: int, init_std: float) -> None:
        super().__init__()
        self.n_heads, self.max_len, self.attn_norm = n_heads, max_len, attn_norm
        self.uvqk = nn.Linear(d_model, 4 * d_model, bias=False)
        nn.init.normal_(self.uvqk.weight, std=init_std)
        self.rab = RelativeBias(max_len, n_time_buckets, init_std)
        self.attn_drop = nn.Dropout(attn_dropout)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> u (B, T, D) and q, k, v each (B, H, T, d)."""
        B, T, D = x.shape
        u, v, q, k = F.silu(self.uvqk(x)).split(D, dim=-1)  # 4 x (B, T, D)
        shape = (B, T, self.n_heads, D // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # (B, T, D) -> (B, H, T, d)
        return u, q, k, v

    def weights(self, q: torch.Tensor, k: torch.Tensor, masks: Masks,
                time_bucket: Optional[torch.Tensor]) -> torch.Tensor:
        """Pointwise weights ``SiLU(q kᵀ + rab) / N_t`` -> (B, H, Tq, T) float, exactly 0 where masked.

        q (B, H, Tq, d) holds the last Tq positions' queries (Tq = T, or 1 under ``last_only``), k (B, H, T, d)
        every key; ``masks.attn`` (B, 1, Tq, T) matches q. A query with no allowed key (left padding) gets
        an all-zero row, never NaN.
        """
        T, Tq = k.shape[2], q.shape[2]  # queries are the last Tq positions (Tq < T: ``last_only``)
        s = q @ k.transpose(-2, -1) + self.rab(T, time_bucket, q.device, Tq).to(q.dtype)  # (B, H, Tq, T)
        if self.attn_norm == "valid":
            n = masks.attn.sum(dim=-1, keepdim=True).clamp(min=1).to(q.dtype)  # (B, 1, Tq, 1)
        else:
            n = float(self.max_len)
        return (F.silu(s) / n).masked_fill(~masks.attn, 0.0)

    def forward(self, x: torch.Tensor, masks: Masks, time_bucket: Optional[torch.Tensor] = None,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> m (B, T', D) attention output (heads concatenated) and gate u (B, T', D);
        T' = T, or 1 with ``last_only`` (only the last position queries; keys and values are all T)."""
        u, q, k, v = self.project(x)
        if last_only:
            u, q = u[:, -1:], q[:, :, -1:]  # (B, 1, D), (B, H, 1, d)
            masks = Masks(attn=masks.attn[:, :, -1:], valid=masks.valid)  # (B, 1, 1, T)
        w = self.weights(q, k, masks, time_bucket)  # (B, H, T', T)
        m = self.attn_drop(w) @ v  # (B, H, T', d)
        B, H, T, d = m.shape
        return m.transpose(1, 2).reshape(B, T, H * d), u  # (B, H, T', d) -> (B, T', D)


class HSTUBlock(nn.Module):
    """``h' = h + f2(drop(LN2(m) ⊙ u))`` with ``m, u = attn(LN1(h))`` (no FFN; BFT.md §3/§4).

    Submodules: ``ln1``, ``attn.uvqk``, ``attn.rab.pos_w``, ``attn.rab.time_w``, ``ln2`` (norm of m),
    ``f2`` (output projection: Xavier-uniform weight, PyTorch's default bias, as the reference). LN eps
    ``LN_EPS``. ``forward(h, masks, time_bucket=None, last_only=False)``: ``time_bucket`` (B, L, L) int64 over
    the L positions the block sees (``HSTU.block_context``), required when the block was built with time
    buckets; ``last_only`` returns the last position alone.
    The block initialises itself (the model does not re-init it).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, attn_dropout: float, max_len: int,
                 attn_norm: str, n_time_buckets: int, init_std: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = PointwiseAttention(d_model, n_heads, attn_dropout, max_len, attn_norm, n_time_buckets,
                                       init_std)
        self.ln2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.f2 = nn.Linear(d_model, d_model)  # bias: torch's default U(±1/sqrt(D)), as the reference
        nn.init.xavier_uniform_(self.f2.weight)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, masks: Masks, time_bucket: Optional[torch.Tensor] = None,
                last_only: bool = False, **ctx) -> torch.Tensor:
        """h (B, L, D) float, masks.attn (B, 1, L, L) causal & key-valid -> (B, L, D), or (B, 1, D) for
        the last position only with ``last_only``."""
        m, u = self.attn(self.ln1(h), masks, time_bucket, last_only)
        return (h[:, -1:] if last_only else h) + self.f2(self.drop(self.ln2(m) * u))


@MODELS.register("hstu")
class HSTU(SeqRecModel):
    """HSTU backbone: causal next-item model with cosine scores.

    Raises:
        ConfigError: ``time_bias=true`` on data without timestamps; bad ``attn_norm`` or ``positions``,
            ``loss=bce``, ``temperature <= 0``, ``n_time_buckets < 1``; or a shared check (``check_common``) fails.
    """

    Config = HSTUConfig
    causal = True
    prefix_training = True

    def __init__(self, cfg: HSTUConfig, layer_cfg, info: DataInfo) -> None:
        super().__init__()
        check_common(cfg, info.n_items)
        check_choice(cfg.attn_norm, ATTN_NORMS, "model.attn_norm")
        check_choice(cfg.positions, POSITIONS, "model.positions")
        check_choice(cfg.loss, ("sampled_softmax", "ce"), "model.loss")
        if cfg.temperature <= 0:
            raise ConfigError(f"model.temperature={cfg.temperature} must be > 0")
        if cfg.time_bias and not info.has_timestamps:
            raise ConfigError("model.time_bias=true but the dataset has no timestamps; "
                              "set model.time_bias=false (position-only relative bias)")
        if cfg.time_bias and cfg.n_time_buckets < 1:
            raise ConfigError(f"model.n_time_buckets={cfg.n_time_buckets} must be >= 1 with time_bias=true")
        self.cfg, self.n_items = cfg, info.n_items
        D = cfg.d_model
        self.item_emb = nn.Embedding(info.n_items + 1, D, padding_idx=0)
        self.pos_emb = nn.Embedding(cfg.max_len, D)
        self.emb_drop = nn.Dropout(cfg.dropout)
        self.reset_embeddings()
        self.stack = build_stack(
            layer_cfg, HSTUBlock, cfg.n_layers, n_tokens=info.n_items + 1,
            precision_ctx={"input_variance": self.input_variance(), "train_counts": info.train_counts,
                           "pad_id": 0},
            d_model=D, n_heads=cfg.n_heads, dropout=cfg.dropout, attn_dropout=cfg.attn_dropout,
            max_len=cfg.max_len, attn_norm=cfg.attn_norm,
            n_time_buckets=cfg.n_time_buckets if cfg.time_bias else 0, init_std=cfg.init_std)

    @torch.no_grad()
    def reset_embeddings(self) -> None:
        """Reference init: items truncated N(0, init_std), positions truncated N(0, 1/D), both at ±2σ."""
        for w, std in ((self.item_emb.weight, self.cfg.init_std), (self.pos_emb.weight, self.cfg.d_model ** -0.5)):
            nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
        self.item_emb.weight[0].zero_()  # padding

    @torch.no_grad()
    def input_variance(self) -> float:
        """Mean per-coordinate variance of the layer-0 input (item * sqrt(D) + position) at init."""
        x = self.item_emb.weight[1:] * math.sqrt(self.cfg.d_model)  # (N, D)
        return float(x.var(dim=0).mean() + self.pos_emb.weight.var(dim=0).mean())

    def item_embedding(self, item_seq: torch.Tensor) -> torch.Tensor:
        """item_seq (B, L) int64 -> (B, L, D) float item embedding ``e_x · sqrt(D)``, no position, no dropout.

        What the BFT stack's τ MLP reads (``tau_input``, BFT.md §0: positions add no precision).
        """
        return self.item_emb(item_seq) * math.sqrt(self.cfg.d_model)

    def embed(self, item_seq: torch.Tensor) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded -> (B, L, D) float, 0 on padding. ``positions=from_end``: the
        last column is position max_len - 1; ``from_start``: each row's first item is position 0 (reference)."""
        pos = self.pos_emb(position_ids(item_seq, self.cfg.max_len, self.cfg.positions))  # (1 or B, L, D)
        h = self.item_embedding(item_seq) + pos
        return self.emb_drop(h) * item_seq.ne(0).unsqueeze(-1)

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None, last_only: bool = False) -> torch.Tensor:
        """Causal encoding.

        Args:
            item_seq: (B, L) int64, left-padded with 0; only the last ``max_len`` columns are used.
            timestamps: (B, L) int64 unix seconds (any value on padding); required when
                ``time_bias=true``, ignored otherwise.
            mech: optional dict the BFT stack fills with mechanism statistics.
            last_only: the last block may return the last position alone (``Stack``), L' = 1.
        Returns:
            (B, L', D) float, L2-normalised per position (0 stays 0), L' = min(L, max_len).
        Raises:
            ValueError: ``time_bias=true`` and ``timestamps`` is None.
        """
        item_seq = item_seq[:, -self.cfg.max_len:]
        masks = build_masks(item_seq, causal=True)
        h = self.stack(self.embed(item_seq), item_seq, masks, mech=mech, tau_input=self.item_embedding,
                       last_only=last_only, **self.block_context(timestamps))
        return F.normalize(h, dim=-1, eps=1e-6)

    def block_context(self, timestamps: Optional[torch.Tensor]) -> dict:
        """``{"time_bucket": (B, T, T) int64}``, the time-gap bucket of every query-key pair of the last
        ``T = min(L, max_len)`` columns of ``timestamps`` (B, L) int64 unix seconds, computed once per forward
        and read by every block's ``RelativeBias``; ``{}`` with ``time_bias=false``.

        Raises:
            ValueError: ``time_bias=true`` and ``timestamps`` is None.
        """
        if not self.cfg.time_bias:
            return {}
        if timestamps is None:
            raise ValueError("hstu with model.time_bias=true needs timestamps (batch['time'])")
        time = timestamps[:, -self.cfg.max_len:]  # (B, T)
        return {"time_bucket": time_buckets(time[:, :, None] - time[:, None, :], self.cfg.n_time_buckets)}

    def item_table(self) -> torch.Tensor:
        """(N + 1, D) float L2-normalised item embeddings (row 0 stays 0)."""
        return F.normalize(self.item_emb.weight, dim=-1, eps=1e-6)

    def training_loss(self, batch: dict) -> torch.Tensor:
        """Next-item loss at every position (``batch["last_target_only"]``: the last one only), cosine /
        temperature: ``batch["seq"]`` (B, L + 1) int64, inputs seq[:, :-1], targets seq[:, 1:]."""
        inputs, targets = next_item_targets(batch["seq"], batch.get("last_target_only", False))  # (B, L) each
        time = batch.get("time")
        h = self.encode(inputs, time[:, :-1] if time is not None else None,
                        last_only=batch.get("last_position_only", False))  # (B, L, D), or (B, 1, D): the last alone
        targets = targets[:, -h.shape[1]:]  # (B, 1) under trainer.last_position_only
        return next_item_loss(h, targets, self.item_table(), self.cfg.loss, self.cfg.n_negatives,
                              self.n_items, temperature=self.cfg.temperature, ce_chunk=self.cfg.ce_chunk,
                              negatives_per=self.cfg.negatives_per)

    def score_items(self, batch: dict) -> torch.Tensor:
        """``batch["item_seq"]`` (B, L) int64 (+ ``time``) -> (B, N + 1) float32 cosines; column 0 is -inf.

        In eval mode the last block computes the last position only (``Stack``'s ``last_only``)."""
        h = self.encode(batch["item_seq"], batch.get("time"), last_only=not self.training)[:, -1]  # (B, D)
        return full_scores(h, self.item_table(), self.n_items)
