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

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from bftrec.config import ConfigError, check_choice
from bftrec.mechanism import score_position
from bftrec.registry import Registry

MODELS: Registry = Registry("model")

LOSSES = ("ce", "bce", "sampled_softmax")
NEGATIVES_PER = ("batch", "position")  # sampled_softmax: one draw shared by the batch, or one per position


@dataclass
class DataInfo:
    """Runtime facts from the dataset (never from yaml)."""

    n_items: int                      # N: item ids 1..N, 0 = padding
    train_counts: np.ndarray          # (N + 1,) int64 training counts per item id
    has_timestamps: bool = False


class SeqRecModel(nn.Module):
    """Base class: config validation hooks and the shared loss heads.

    Subclasses set ``Config`` (a dataclass), ``causal`` and implement the three contract methods.
    ``prefix_training``: ``training_loss`` honours ``batch["last_target_only"]`` (next-item backbones;
    ``trainer.train_windows=prefixes`` needs it). ``trainable = False``: a statistical model (``pop``,
    ``markov``) that counts instead of training: the trainer calls ``fit_statistics`` once on the training
    sequences, scores validation once and keeps it (``bftrec.trainer.fit``); it has no ``training_loss``.
    """

    Config: type = object
    causal: bool = True
    prefix_training: bool = False
    trainable: bool = True

    def fit_statistics(self, items: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Statistical models only (``trainable = False``): count what the scores need from the training
        sequences ``items[start[u]:end[u]]`` ((nnz,) int64 item ids; (U,) int64 bounds: each user's items before
        the validation target).

        Raises:
            NotImplementedError: a trainable model (it learns through ``training_loss``).
        """
        raise NotImplementedError(f"{type(self).__name__} is trained, not counted")

    def _init(self, m: nn.Module) -> None:
        """N(0, cfg.init_std) for Linear and Embedding weights, zero biases and padding rows."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                nn.init.zeros_(m.weight[m.padding_idx])

    @staticmethod
    @torch.no_grad()
    def xavier_normal_matrices(module: nn.Module) -> None:
        """Xavier (Glorot) normal on every parameter of ``module`` with 2 or more dimensions, in place:
        N(0, 2 / (fan_in + fan_out)); vectors (biases, LayerNorm) are left as they are, and an
        Embedding's padding row is set back to zero.

        RecTools' transformer models (the eSASRec benchmark's SASRec, issue 11 item 6) initialise this
        way before training (its ``_xavier_normal_init``); there the padding row is drawn too, which
        changes nothing because padding positions are masked. An item table of (N + 1, D) gets std
        ``sqrt(2 / (N + 1 + D))``: 0.010 on Sports at D=64, against 0.02 for ``_init``.
        """
        for p in module.parameters():
            if p.dim() > 1:
                nn.init.xavier_normal_(p)
        for m in module.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()

    def encode(self, item_seq: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
               mech: Optional[dict] = None) -> torch.Tensor:
        """item_seq (B, L) int64, left-padded with 0, L <= max_len; timestamps (B, L) int64 unix seconds
        or None -> (B, L, D) float hidden states. ``mech``: a dict the BFT stack fills with its
        mechanism (Kalman gain K, precision λ per block; BFT.md §6), None = not recorded.

        Raises:
            NotImplementedError: a subclass that does not implement it (the contract, module docstring).
        """
        raise NotImplementedError

    def block_context(self, timestamps: Optional[torch.Tensor]) -> dict:
        """Per-batch tensors every block reads, computed once per forward from ``timestamps`` (B, L) int64
        or None and handed to the stack as keyword arguments (HSTU: the (B, T, T) time-bucket table);
        ``{}`` here: no block of SASRec or BERT4Rec reads any."""
        return {}

    def training_loss(self, batch: dict) -> torch.Tensor:
        """Scalar float loss of one training batch (``seq`` (B, L + 1) int64, ``time`` (B, L + 1) int64
        or absent, ``last_target_only`` for ``prefix_training`` backbones); the backbone owns its
        objective (next-item for SASRec/HSTU, cloze for BERT4Rec).

        Raises:
            NotImplementedError: a subclass that does not implement it.
        """
        raise NotImplementedError

    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, N + 1) float scores of every item id for the next position of ``item_seq`` (B, L) int64
        (``time`` (B, L) int64 or absent); column 0 (padding) and special ids are ``-inf``. The
        evaluator ranks these under full ranking (DESIGN.md, evaluation protocol).

        Raises:
            NotImplementedError: a subclass that does not implement it.
        """
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
        """Per-layer BFT statistics of the test histories (BFT.md §6), plus ``at_score``, the values at the
        scoring position (the last one; ``bftrec.mechanism.score_position``); {} for standard layers."""
        mech: dict = {}
        with torch.no_grad():
            self.encode(batch["item_seq"], batch.get("time"), mech=mech)
        return score_position(mech)


def check_standard_layer_only(name: str, layer_cfg) -> None:
    """A model without Transformer layers (``pop``, ``markov``, ``gru4rec``): only ``layer=standard`` means anything.

    Raises:
        ConfigError: any other layer, in one line (its text says "not available", which the contract suite
            reads as an expected failure, as for a backbone without a BFT twin).
    """
    if getattr(layer_cfg, "name", "standard") != "standard":
        raise ConfigError(f"layer={layer_cfg.name} is not available for model={name}, which has no Transformer "
                          "layers; use layer=standard")


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
    if getattr(cfg, "ce_chunk", CE_CHUNK) < 0:
        raise ConfigError(f"model.ce_chunk={cfg.ce_chunk} must be >= 1 (positions per softmax chunk), "
                          f"or 0 for the unchunked reference")
    check_choice(getattr(cfg, "negatives_per", "batch"), NEGATIVES_PER, "model.negatives_per")
    if cfg.loss in ("sampled_softmax", "bce") and cfg.n_negatives < 1:
        raise ConfigError(f"model.n_negatives={cfg.n_negatives} must be >= 1 for loss={cfg.loss}")
    if cfg.loss == "sampled_softmax" and cfg.n_negatives >= n_items:
        raise ConfigError(f"model.n_negatives={cfg.n_negatives} must be < the number of items ({n_items}); "
                          f"use loss=ce for a full softmax")


CE_CHUNK = 128
"""Default rows (positions) per chunk of the full-softmax CE (``model.ce_chunk``). Measured on CPU
(scripts/bench_train.py, ``chunk_sweep_head_alone`` in results/bench/train_cpu.json): 64 to 256 are
equal within run-to-run noise (about 10%, their order changes between runs), 32 and >= 512 slower; 128
keeps the buffer at N x 128 floats (9.4 MB for Sports)."""

# Per-position negatives (negatives_per=position): with N + 1 table rows and K negatives, the logits
# come from a dense (chunk, N + 1) matmul and a column gather when N + 1 <= DENSE_NEGATIVES_RATIO * K,
# and otherwise from a gathered (P, K, D) block. Both give the same logits; the gather is memory-bound,
# so the dense route, N / K times the multiply-adds, is cheaper up to 80-90 x K rows on one CPU thread
# (results/bench/negatives_cpu.json, scripts/bench_negatives.py: 2.2x on ML-1M, 5.8x on ml-100k, 1.1x on Instruments;
# Beauty is a tie; it varies by 10-20% between runs).
DENSE_NEGATIVES_RATIO = 80
DENSE_NEGATIVES_BLOCK = 1 << 21  # elements of one (chunk, N + 1) block of the dense route (8 MB float32)


def dense_negatives(n_rows: int, k: int) -> bool:
    """Whether :func:`per_position_logits` takes the dense route for ``n_rows`` table rows and ``k``
    negatives per position: ``n_rows <= DENSE_NEGATIVES_RATIO * k``."""
    return n_rows <= DENSE_NEGATIVES_RATIO * k


class _ChunkedLogSumExp(torch.autograd.Function):
    """``sum_p logsumexp_j scale * (h_p . table_j + bias_j)`` over chunks of rows; see :func:`chunked_ce`.

    The output is a scalar, so its gradient is known up to the incoming factor while the softmax
    of a chunk is at hand: the forward accumulates ``d/dh`` (P, D), ``d/dtable`` (N, D) and
    ``d/dbias`` (N,) and the backward only scales them. No (P, N) tensor and no recomputation.
    """

    @staticmethod
    def forward(ctx, h, table, bias, scale: float, chunk: int, with_grad: bool):
        total, grads = _lse_chunks(h, table, bias, scale, chunk, with_grad)
        ctx.in_dtypes = (h.dtype, table.dtype)
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        gh, gw, gb = ctx.saved_tensors
        dh, dw = ctx.in_dtypes
        return ((gh * g).to(dh), (gw * g).to(dw), gb * g if gb is not None else None, None, None, None)


def _lse_chunks(h: torch.Tensor, table: torch.Tensor, bias: Optional[torch.Tensor], scale: float, chunk: int,
                with_grad: bool) -> tuple[torch.Tensor, tuple]:
    """Sum over rows of the logsumexp of ``scale * (h @ table.T + bias)`` and, if ``with_grad``, its
    gradients w.r.t. h, table, bias; in chunks of ``chunk`` rows through one reused (N, chunk) buffer.

    h (P, D), table (N, D) of one dtype; bias (N,) or None. Softmax in float32 (float64 for float64 inputs).
    """
    P, N = h.shape[0], table.shape[0]
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    total = torch.zeros((), dtype=acc, device=h.device)
    gh = torch.empty(h.shape, dtype=acc, device=h.device) if with_grad else None
    gw = torch.zeros(table.shape, dtype=acc, device=h.device) if with_grad else None
    gb = torch.zeros(N, dtype=acc, device=h.device) if with_grad and bias is not None else None
    buf = torch.empty(N * min(chunk, P), dtype=h.dtype, device=h.device)  # the only (N, .) allocation
    for lo in range(0, P, chunk):
        hc = h[lo: lo + chunk]  # (c, D), c <= chunk (ragged last chunk)
        c = hc.shape[0]
        # logits transposed, (N, c): table @ h^T runs faster than h @ table^T on CPU (measured)
        z = torch.mm(table, hc.t(), out=buf[: N * c].view(N, c))
        z = z if z.dtype == acc else z.to(acc)  # low-precision matmul (AMP): softmax in float32
        if bias is not None:
            z.add_(bias[:, None])
        if scale != 1.0:
            z.mul_(scale)
        m = z.amax(0, keepdim=True)  # (1, c)
        z.sub_(m).exp_()  # unnormalised softmax over items, in place
        s = z.sum(0, keepdim=True)  # (1, c)
        total += (m + s.log()).sum()
        if with_grad:
            r = (scale / s).t()  # (c, 1): d lse / d(h . table_j + b_j) = scale * softmax_j = z_j * r
            p = z if z.dtype == h.dtype else z.to(h.dtype)  # (N, c)
            gh[lo: lo + c] = torch.mm(p.t(), table) * r  # (c, D)
            hr = (hc * r).to(h.dtype)  # (c, D)
            if gw.dtype == h.dtype:
                gw.addmm_(p, hr)  # (N, D)
            else:
                gw.add_(torch.mm(p, hr))
            if gb is not None:
                gb.add_(torch.mv(z, r.squeeze(1).to(z.dtype)))  # (N,)
    return total, (gh, gw, gb)


def chunked_ce(h: torch.Tensor, targets: torch.Tensor, table: torch.Tensor, bias: Optional[torch.Tensor] = None,
               scale: float = 1.0, chunk: int = CE_CHUNK) -> torch.Tensor:
    """Full-softmax cross-entropy without materialising the (P, N) logits or their gradient.

    ``mean_p [logsumexp_j z_pj - z_p,targets_p]`` with ``z = scale * (h @ table.T + bias)``; equal to
    :func:`plain_ce` up to float32 rounding. Memory O(chunk x N + (P + N) x D): the logsumexp is
    taken per chunk of ``chunk`` rows, whose softmax also gives the gradients at once (the output is
    a scalar), so the backward neither stores nor recomputes logits. Under autocast the two matmuls
    run in the autocast dtype, the softmax in float32 (as ``F.cross_entropy(logits.float())``).

    Args:
        h: (P, D) float hidden states, one row per target.
        targets: (P,) int64 class indices in ``[0, N)``.
        table: (N, D) float class embeddings (items 1..N: the caller drops padding row 0).
        bias: optional (N,) float class bias.
        scale: logit multiplier (1 / temperature); 1.0 skips the multiplication.
        chunk: rows per chunk, >= 1.
    Returns:
        scalar float32 (float64 for float64 inputs).
    Raises:
        ValueError: ``chunk < 1``.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 (rows of the CE per chunk; model.ce_chunk)")
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    target = (h.to(acc) * table[targets].to(acc)).sum(-1)  # (P,) target logits
    if bias is not None:
        target = target + bias[targets].to(acc)
    target = target * scale if scale != 1.0 else target
    dev = h.device.type
    hm, tm = h, table
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        hm, tm = h.to(dt), table.to(dt)
    elif tm.dtype != hm.dtype:
        tm = tm.to(hm.dtype)
    with_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, table, bias))
    with torch.autocast(dev, enabled=False):
        lse_sum = _ChunkedLogSumExp.apply(hm, tm, bias.to(acc) if bias is not None else None, float(scale),
                                          int(chunk), with_grad)
    return (lse_sum - target.sum()) / len(targets)


def plain_ce(h: torch.Tensor, targets: torch.Tensor, table: torch.Tensor, bias: Optional[torch.Tensor] = None,
             scale: float = 1.0) -> torch.Tensor:
    """The reference full-softmax CE: materialises (P, N) logits; same arguments as :func:`chunked_ce`."""
    logits = h @ table.t()  # (P, N)
    if bias is not None:
        logits = logits + bias
    if scale != 1.0:
        logits = logits * scale
    return F.cross_entropy(logits if logits.dtype in (torch.float32, torch.float64) else logits.float(), targets)


def next_item_targets(seq: torch.Tensor, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of a next-item window: seq (B, L + 1) int64 -> inputs ``seq[:, :-1]`` (B, L) and
    targets ``seq[:, 1:]`` (B, L), 0 (no target) where the input is padding; with ``last_only`` the last
    column's target only (``trainer.train_windows=prefixes``: one sample per target, RecBole's augmentation)."""
    inputs, targets = seq[:, :-1], seq[:, 1:]  # (B, L) each
    targets = targets * inputs.ne(0)  # no target where the input is padding
    if last_only:
        targets = torch.cat([torch.zeros_like(targets[:, :-1]), targets[:, -1:]], dim=1)  # (B, L)
    return inputs, targets


def next_item_loss(h: torch.Tensor, targets: torch.Tensor, item_emb: torch.Tensor, loss: str,
                   n_negatives: int, n_items: int, bias: Optional[torch.Tensor] = None,
                   temperature: float = 1.0, ce_chunk: int = CE_CHUNK,
                   negatives_per: str = "batch") -> torch.Tensor:
    """Loss of predicting ``targets`` from hidden states, averaged over non-padding positions.

    Args:
        h: (B, L, D) float hidden states.
        targets: (B, L) int64 target item ids, 0 = no target (padding).
        item_emb: (N + 1 (+ specials), D) float output embedding table, tied to the input one.
        loss: ``ce`` full softmax over items 1..N; ``bce`` one uniform negative per position
            (SASRec, Kang & McAuley 2018); ``sampled_softmax`` ``n_negatives`` uniform negatives,
            accidental hits masked.
        bias: optional (N + 1 (+ specials),) output bias (BERT4Rec).
        temperature: logits are divided by it (HSTU's cosine logits); 1.0 skips the division.
        ce_chunk: ``ce`` only: positions per chunk of :func:`chunked_ce`; 0 = :func:`plain_ce`, the
            reference that materialises the (P, N) logits.
        negatives_per: ``sampled_softmax`` only: ``batch`` draws one (K,) set shared by every
            position (a (P, D) x (D, K) matmul); ``position`` draws a (P, K) set, each position its
            own, as HSTU's reference does (``LocalNegativesSampler`` in meta-recsys/generative-recommenders;
            computed by :func:`per_position_logits`).
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
        # padding (id 0) is never a class: classes are items 1..N, i.e. rows 1.. of the table, so the
        # target id t is class t - 1 (slicing costs nothing and, unlike masking column 0, no copy)
        args = (h, pos - 1, table[1:], b[1:] if b is not None else None, 1.0 / temperature)
        return chunked_ce(*args, chunk=ce_chunk) if ce_chunk else plain_ce(*args)
    if loss == "bce":
        neg = torch.randint(1, n_items + 1, pos.shape, device=pos.device)  # (P,)
        pos_logit = (h * table[pos]).sum(-1)
        neg_logit = (h * table[neg]).sum(-1)
        if b is not None:
            pos_logit, neg_logit = pos_logit + b[pos], neg_logit + b[neg]
        return (F.binary_cross_entropy_with_logits(pos_logit.float(), torch.ones_like(pos_logit, dtype=torch.float))
                + F.binary_cross_entropy_with_logits(neg_logit.float(), torch.zeros_like(neg_logit, dtype=torch.float)))
    # sampled softmax: column 0 is the positive, then the negatives
    pos_logit = (h * table[pos]).sum(-1, keepdim=True)  # (P, 1)
    if negatives_per == "position":
        neg = torch.randint(1, n_items + 1, (len(pos), n_negatives), device=pos.device)  # (P, K)
        neg_logit = per_position_logits(h, table, neg)  # (P, K)
        hit = neg == pos[:, None]  # (P, K)
    else:
        neg = torch.randint(1, n_items + 1, (n_negatives,), device=pos.device)  # (K,)
        neg_logit = h @ table[neg].t()  # (P, K)
        hit = neg[None, :] == pos[:, None]  # (P, K)
    if b is not None:
        pos_logit, neg_logit = pos_logit + b[pos, None], neg_logit + b[neg]
    neg_logit = neg_logit.masked_fill(hit, torch.finfo(neg_logit.dtype).min)
    logits = torch.cat([pos_logit, neg_logit], dim=1).float()  # (P, 1 + K)
    logits = logits / temperature if temperature != 1.0 else logits
    return F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=pos.device))


def per_position_logits(h: torch.Tensor, table: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Logits of each position against its own negatives: ``out[p, k] = h[p] . table[neg[p, k]]``.

    Args:
        h: (P, D) float hidden states.
        table: (R, D) float item embeddings (R = N + 1 rows, padding included).
        neg: (P, K) int64 row ids in [0, R).
    Returns:
        (P, K) float, in ``h``'s dtype. Two routes with the same result to float rounding: with
        R <= ``DENSE_NEGATIVES_RATIO`` * K, blocks of (chunk, R) dense logits (one matmul, then a
        column gather; at most ``DENSE_NEGATIVES_BLOCK`` elements each); otherwise a gathered
        (P, K, D) block times h, about P K D x 4 bytes, twice with its gradient.
    """
    n_rows, k = table.shape[0], neg.shape[1]
    if not dense_negatives(n_rows, k):
        return torch.bmm(table[neg], h.unsqueeze(-1)).squeeze(-1)  # (P, K, D) @ (P, D, 1) -> (P, K)
    chunk = max(1, DENSE_NEGATIVES_BLOCK // n_rows)
    blocks = [torch.gather(h[s:s + chunk] @ table.t(), 1, neg[s:s + chunk])  # (chunk, R) -> (chunk, K)
              for s in range(0, len(h), chunk)]
    if not blocks:  # P = 0
        return h.new_zeros(0, k)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


_SCORE_POOL: contextvars.ContextVar = contextvars.ContextVar("score_pool", default=None)


@contextmanager
def reused_score_buffer(pool: dict):
    """Within the block, :func:`full_scores` writes into the float32 buffer kept in ``pool`` (one per
    device, grown as needed; pass the same dict to reuse it across blocks).

    The full-ranking scorer holds one chunk's (B, N + 1) scores at a time; a fresh block that size
    costs page faults and zero-filling on every chunk on CPU (as much as half the matmul at Sports'
    size). Each result is overwritten by the next call with that pool, so use it only where no
    earlier result is kept (``bftrec.evaluation.rank_users``). With gradients enabled, or for a
    dtype other than float32, ``full_scores`` allocates as usual.
    """
    token = _SCORE_POOL.set(pool)
    try:
        yield
    finally:
        _SCORE_POOL.reset(token)


def full_scores(h_last: torch.Tensor, item_emb: torch.Tensor, n_items: int,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, D) @ (N + 1, D)^T -> (B, N + 1) float32 with padding (column 0) set to -inf.

    Inside :func:`reused_score_buffer` (no grad, float32) the result lives in a reused buffer.
    """
    table = item_emb[: n_items + 1]
    pool = _SCORE_POOL.get()
    if pool is not None and not torch.is_grad_enabled() and h_last.dtype == table.dtype == torch.float32:
        need = h_last.shape[0] * (n_items + 1)
        buf = pool.get(h_last.device)
        if buf is None or buf.numel() < need:
            buf = pool[h_last.device] = torch.empty(need, dtype=torch.float32, device=h_last.device)
        scores = torch.mm(h_last, table.t(), out=buf[:need].view(h_last.shape[0], n_items + 1))
        if bias is not None:
            scores.add_(bias[: n_items + 1])
    else:
        scores = (h_last @ table.t()).float()
        if bias is not None:
            scores = scores + bias[: n_items + 1].float()
    scores[:, 0] = float("-inf")
    return scores
