"""Observe (docs/BFT.md §1): precision-weighted kriging attention, its REML shrinkage and the output precision λ^obs.

Conventions (shapes, rows, clamps, dtypes): ``bftrec.layers.precision``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from bftrec.layers.precision.compile import compilable
from bftrec.layers.precision.rows import gather_head_rows, scatter_rows


# --------------------------------------------------------------------------------------------------
# Observe (BFT.md §1)
# --------------------------------------------------------------------------------------------------
def log_mean_precision(lam: torch.Tensor, lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """``log clamp(λ̄_j)`` with ``λ̄_j = exp(mean_D log λ_j)`` [bftrec] (BFT.md "Notation": geometric mean).

    Args:
        lam: (n, D) float32 rows, ``> 0`` (the stack keeps λ inside its clamps on rows).
    Returns:
        (n,) float32.
    """
    return torch.log(lam).mean(-1).clamp(math.log(lo), math.log(hi))


def geometric_mean_d(x: torch.Tensor) -> torch.Tensor:
    """``exp(mean_D log x)``, the per-token summary ``λ̄`` of BFT.md "Notation" and §6, without clamps.

    For reporting (mechanism statistics): (n, D) float ``>= 0`` -> (n,) float; a row with a zero (a
    query without keys has ``λ^obs = 0``) gives 0, never NaN. Not for use under autograd.
    """
    return torch.log(x).mean(-1).exp()


@compilable
def kriging_bias(lam: torch.Tensor, rows: torch.Tensor, B: int, T: int, lo: float = 1e-8,
                 hi: float = 1e8) -> torch.Tensor:
    """Additive attention-logit bias of the kriging weights [paper] (BFT.md §1).

    ``α̃_tj ∝ α_tj λ̄_j`` is a softmax over ``s_tj + log λ̄_j``. Padding keys get 0 here; they are
    removed by the attention mask (``masked_softmax``), which is BFT.md's ``where(valid_j, ·, -inf)``
    without ever forming ``-inf`` (no NaN gradients).

    Args:
        lam: (n, D) float32 rows; rows: (n,) int64.
    Returns:
        (B, 1, 1, T) float32, broadcastable against (B, H, T, T) logits.
    """
    return scatter_rows(log_mean_precision(lam, lo, hi), rows, B, T)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)


def kriging_moments(alpha: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kriging mean and residual variance via the expanded square [paper; form bftrec] (BFT.md §1).

    ``m_t = Σ_j α̃_tj v_j`` and ``S_t = Σ_j α̃_tj (v_j − m_t)² = Σ_j α̃_tj v_j² − m_t²`` (clamped at
    ``>= 0``), per value coordinate. Both moments come from one batched matmul of the same weights
    with ``[v, v⊙v]``; no (B, H, T, T, d) tensor exists. The identity needs ``Σ_j α̃_tj = 1``, which
    holds for every row with a valid key; a row with no valid key (all-zero weights) gives
    ``m = 0, S = 0`` and must be masked by the caller.

    Args:
        alpha: (B, H, T, T) float, undropped kriging weights, rows sum to 1 or are all 0.
        v: (B, H, T, d) float values.
    Returns:
        m (B, H, T, d), S (B, H, T, d), in the dtype of the inputs.
    """
    d = v.shape[-1]
    mom = alpha @ torch.cat([v, v * v], dim=-1)  # (B, H, T, 2d)
    m, m2 = mom[..., :d], mom[..., d:]  # (B, H, T, d) each
    return m, torch.relu(torch.addcmul(m2, m, m, value=-1.0))  # relu = clamp at 0, one-pass backward


class _KishB(torch.autograd.Function):
    """``b = Σ_j α̃_j(1 − α̃_j)`` over the last dim, saving only ``α̃`` (the caller keeps it anyway).

    ``1 − α̃`` is exact in floating point for ``α̃ ∈ [1/2, 1]`` (Sterbenz), so each term carries one
    rounding: exact to float rounding per element, unlike ``α̃ − α̃²``, whose rounded square loses up
    to ~1e-4 relative in float32 near ``α̃ = 1 − 2e-4``. Backward: ``∂b/∂α̃ = 1 − 2α̃``.
    """

    @staticmethod
    def forward(ctx, alpha: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(alpha)
        return torch.rsub(alpha, 1.0).mul_(alpha).sum(-1)  # one (…, T) temporary

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (alpha,) = ctx.saved_tensors
        return torch.rsub(alpha * 2.0, 1.0).mul_(g[..., None])


def kish_b(alpha: torch.Tensor) -> torch.Tensor:
    """``Σ_j α̃_j(1 − α̃_j)`` over the last dim (BFT.md §1, ``n − 1 = b/a2``): (..., T) -> (...).

    Exact to float rounding per element; autograd saves only ``α̃`` (``_KishB``).
    """
    return _KishB.apply(alpha)


def kish_sums(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums behind the Kish effective sample size [bftrec] (BFT.md §1).

    ``n = 1/a2`` and ``n − 1 = b/a2`` with ``a2 = Σ_j α̃_j²`` and ``b = Σ_j α̃_j(1 − α̃_j)``.
    ``b`` is summed elementwise as BFT.md writes it, never as ``1 − a2`` (in float32 ``n − 1`` would
    collapse to 0 when one weight is ``1 − 1e-8``) nor as ``Σ(α̃ − α̃²)`` (the rounded square loses
    up to ~1e-4 relative near ``α̃ = 1 − 2e-4``); each term is exact to float rounding (``kish_b``).

    Args:
        alpha: (B, H, T, T) float, undropped kriging weights.
    Returns:
        a2 (B, H, T), b (B, H, T); both 0 on a row with no valid key.
    """
    return (alpha * alpha).sum(-1), kish_b(alpha)


class _KrigingStats(torch.autograd.Function):
    """``kriging_moments`` and ``kish_sums`` in one autograd node with a hand-written backward.

    Forward: one batched matmul of α̃ with ``[v, v⊙v]`` and two passes over (B, H, T, T). It saves only
    ``α̃``, ``v`` (shared with the value path), ``m`` and the bool mask ``S > 0``; backward recomputes
    ``[v, v⊙v]`` (B, H, T, 2d) and needs one batched matmul per input:
    ``∂α̃ = [∂m − 2m⊙∂S, ∂S] @ [v, v⊙v]ᵀ + 2α̃ ⊙ ∂a2 + (1 − 2α̃) ⊙ ∂b`` and
    ``∂v = (α̃ᵀ @ ∂mom)[:d] + 2v ⊙ (α̃ᵀ @ ∂mom)[d:]``, with ``∂S`` masked where the clamp at 0 binds.
    """

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, v: torch.Tensor):
        d = v.shape[-1]
        mom = alpha @ torch.cat([v, v * v], dim=-1)  # (B, H, T, 2d)
        m = mom[..., :d].contiguous()  # (B, H, T, d)
        S = torch.relu_(mom[..., d:].addcmul_(m, m, value=-1.0))  # (B, H, T, d) view of mom, clamped at 0
        a2 = (alpha * alpha).sum(-1)  # (B, H, T), one (B, H, T, T) temporary
        b = torch.rsub(alpha, 1.0).mul_(alpha).sum(-1)  # Σ α̃(1 − α̃), elementwise, exact to rounding (kish_b)
        ctx.save_for_backward(alpha, v, m, S > 0)  # a bool mask, so the (B, H, T, 2d) moments are freed
        return m, S, a2, b

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_m, g_S, g_a2, g_b):
        alpha, v, m, pos = ctx.saved_tensors
        g_m = torch.zeros_like(m) if g_m is None else g_m
        g_S = torch.zeros_like(m) if g_S is None else g_S * pos
        g_mom = torch.cat([torch.addcmul(g_m, m, g_S, value=-2.0), g_S], dim=-1)  # (B, H, T, 2d)
        g_alpha = g_v = None
        if ctx.needs_input_grad[0]:
            g_alpha = g_mom @ torch.cat([v, v * v], dim=-1).transpose(-2, -1)  # (B, H, T, T)
            if g_a2 is not None or g_b is not None:
                ga2 = torch.zeros_like(m[..., 0]) if g_a2 is None else g_a2  # (B, H, T)
                gb = torch.zeros_like(ga2) if g_b is None else g_b
                g_alpha.add_(gb[..., None]).addcmul_(alpha, (2.0 * (ga2 - gb))[..., None])  # + 2α̃∂a2 + (1−2α̃)∂b
        if ctx.needs_input_grad[1]:
            d = v.shape[-1]
            g_vv = alpha.transpose(-2, -1) @ g_mom  # (B, H, T, 2d)
            g_v = torch.addcmul(g_vv[..., :d], v, g_vv[..., d:], value=2.0)
        return g_alpha, g_v


def kriging_stats(alpha: torch.Tensor, v: torch.Tensor):
    """``(m, S) = kriging_moments(α̃, v)`` and ``(a2, b) = kish_sums(α̃)`` as one lean autograd node.

    Same values and gradients as the two reference functions (unit-tested with ``gradcheck``).
    Shapes: alpha (B, H, T, T), v (B, H, T, d) -> m, S (B, H, T, d), a2, b (B, H, T).
    """
    return _KrigingStats.apply(alpha, v)


@compilable
def reml_shrinkage(S: torch.Tensor, a2: torch.Tensor, b: torch.Tensor, s0sq: torch.Tensor, prior_dof: float,
                   ok: torch.Tensor) -> torch.Tensor:
    """Shrunk kriging variance and ``Var(m) = σ²/n`` [paper: REML + inverse-χ² prior; form bftrec] (BFT.md §1).

    ``σ²_t = (ν₀ s₀² + n_t S_t) / (ν₀ + n_t − 1)`` with ``n = 1/a2`` and ``n − 1 = b/a2``: the posterior
    scale of a scaled-inverse-χ²(ν₀, s₀²) prior updated with the REML estimate ``S n/(n−1)`` on
    ``n − 1`` degrees of freedom. Finite at ``n = 1``, where it returns ``s₀²``. Computed as
    ``σ²/n = (ν₀ s₀² a2 + S) / (ν₀ + n − 1)``: two passes over S.

    Args:
        S: (n, H, d) float plug-in residual variance of query rows (``kriging_stats``, ``gather_head_rows``).
        a2, b: (n, H) float from ``kish_sums``.
        s0sq: (H, d) float prior scale ``s₀²`` (the layer's buffer, value before this forward).
        prior_dof: ``ν₀ > 0``.
        ok: (n, 1|H) bool, rows that have at least one valid key (others are masked, not computed).
    Returns:
        Var(m) (n, H, d), 0 where not ``ok``.
    """
    a2s = torch.where(ok, a2, torch.ones_like(a2))  # (n, H), safe
    n_m1 = b / a2s  # n − 1, never by subtraction
    inv_den = ok.to(S.dtype) / (prior_dof + n_m1)  # (n, H), 0 where not ok
    return torch.addcmul(S, a2s[..., None], prior_dof * s0sq) * inv_den[..., None]


def prior_statistic(S: torch.Tensor, a2: torch.Tensor, b: torch.Tensor, ok: torch.Tensor,
                    min_n: float = 1.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums for the ``s₀²`` update [bftrec] (BFT.md §1): the REML variance ``S n/(n−1) = S/b``.

    Averaged over rows with ``n > min_n`` (i.e. ``b > (min_n − 1) a2``).

    Args:
        S: (n, H, d); a2, b: (n, H); ok: (n, 1|H) bool.
    Returns:
        total (H, d) float sum of ``S n/(n−1)`` over kept rows, count (H,) float number of kept rows.
    """
    keep = ok & (b > (min_n - 1.0) * a2)  # (n, H): n > min_n
    w = keep.to(S.dtype) / torch.where(keep, b, torch.ones_like(b))  # (n, H)
    return torch.einsum("nhd,nh->hd", S, w), keep.sum(0).to(S.dtype)  # (H, d), (H,)


@compilable
def output_precision(var_m: torch.Tensor, w_out: torch.Tensor, lo: float = 1e-8, hi: float = 1e8,
                     has_key: Optional[torch.Tensor] = None, one_obs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Observation precision from ``Var(o)_k = Σ_c G[k,c]² Var(m)_c`` [paper: delta method] (BFT.md §1, §7).

    One matmul with ``G ⊙ G`` (the bias of the output projection is deterministic).

    - ``bft.units=h`` (``one_obs`` None, v1): ``λ^obs = 1/Var(o)`` with ``Var(o)`` clamped to ``[lo, hi]``.
    - ``bft.units=count`` (``one_obs`` given, §7): ``λ̂^obs = Var₁(o)/Var(o)`` with the one-observation
      variance ``Var₁(o)_k = Σ_c G[k,c]² one_obs_c``; the dimensionless ratio is clamped, never ``Var(o)``.

    Args:
        var_m: (n, D) float rows, heads concatenated (already multiplied by any per-row factor of ``G``).
        w_out: (D, D) float, ``nn.Linear`` weight of the output projection (``G`` up to per-row factors).
        has_key: optional (n,) bool; a row without any valid key gets no observation, ``λ^obs = 0``.
        one_obs: optional (D,) or (n, D) float, ``s₀²_c a_t²`` times the same per-row factors as ``var_m``.
    Returns:
        (n, D) float.
    """
    w2 = w_out * w_out  # (D, D)
    var_o = F.linear(var_m, w2)  # (n, D)
    if one_obs is None:
        lam_obs = var_o.clamp(lo, hi).reciprocal()
    else:
        var_1 = F.linear(one_obs, w2)  # (D,) one matvec, or (n, D)
        safe = torch.where(var_o > 0, var_o, torch.ones_like(var_o))  # rows without keys: Var(o) = 0
        lam_obs = (var_1 / safe).clamp(lo, hi)
    return lam_obs if has_key is None else lam_obs * has_key[:, None].to(lam_obs.dtype)


def observe_precision(alpha: torch.Tensor, v: torch.Tensor, s0sq: torch.Tensor, w_out: torch.Tensor,
                      ok: torch.Tensor, rows: torch.Tensor, prior_dof: float, lo: float = 1e-8, hi: float = 1e8,
                      want_prior: bool = False, set_prior=None, count: bool = False):
    """The observe step's statistics, from kriging weights to ``λ^obs`` (BFT.md §1).

    ``kriging_stats`` (moments and Kish sums, all query rows) → valid query rows → ``reml_shrinkage`` →
    heads concatenated → ``output_precision`` (under ``count``, §7: ``λ̂^obs = Var₁(o)/Var(o)`` with
    ``Var₁(o) = (W_O ⊙ W_O) s₀²``, softmax weights: ``a_t = 1``).

    Args:
        alpha: (B, H, T, T) float32 undropped kriging weights (rows sum to 1 or are all 0).
        v: (B, H, T, d) float32 values.
        s0sq: (H, d) float32 prior scale before this forward.
        w_out: (D, D) float32 output-projection weight ``W_O``.
        ok: (B, 1|H, T) bool query rows that are valid and have at least one valid key.
        rows: (n,) int64 valid positions.
        prior_dof: ν₀ > 0; lo, hi: clamps.
        want_prior: also return the sums for the ``s₀²`` update (``prior_statistic``), no grad.
        set_prior: calibration only: a callable ``(total (H, d), count (H,)) -> new s0sq (H, d)`` run
            before the shrinkage, so the layer uses the prior it has just set (BFT.md §1).
        count: ``bft.units=count`` (BFT.md §7), else ``h`` (v1).
    Returns:
        m (B, H, T, d) undropped kriging mean, λ^obs (n, D) rows (in counts under ``count``), a2 (B, H, T)
        (``Σ α̃²``, Kish ``n = 1/a2``), prior sums ``(total (H, d), count (H,))`` or None.
    """
    m, S, a2, b = kriging_stats(alpha, v)  # (B, H, T, d) x2, (B, H, T) x2
    S_r, a2_r, b_r = gather_head_rows(S, rows), gather_head_rows(a2, rows), gather_head_rows(b, rows)  # (n, H, ·)
    ok_r = gather_head_rows(ok, rows)  # (n, 1|H)
    lam_obs, prior = observe_from_stats(S_r, a2_r, b_r, ok_r, s0sq, w_out, prior_dof, lo, hi, want_prior,
                                        set_prior, count)
    return m, lam_obs, a2, prior


class _KrigingAttention(torch.autograd.Function):
    """Masked softmax, attention dropout, value path, kriging moments and Kish sums in one autograd node.

    The fast path of BFT.md §1 (``kriging_attention``); the reference is ``masked_softmax`` →
    ``nn.Dropout`` → ``@ v`` beside ``kriging_stats`` → ``gather_head_rows`` (unit-tested against it).
    It saves ``α̃`` once (the softmax output *is* the kriging weight), the dropout mask as bool, ``v``,
    ``m`` and a bool mask of the clamp ``S > 0`` on the valid rows: less than the standard layer's
    attention keeps (softmax output and dropped weights). Backward forms one (B, H, T, T) gradient,
    ``∂α̃ = (∂m_v @ vᵀ) ⊙ mask/(1−p) + [∂m − 2m⊙∂S, ∂S] @ [v, v⊙v]ᵀ + 2α̃ ⊙ ∂a2 + (1 − 2α̃) ⊙ ∂b``
    (with ``∂m = ∂m_v`` when there is no dropout), and runs the softmax backward on it.
    """

    @staticmethod
    def forward(ctx, logits, bias, allowed, v, rows, p: float, train: bool, stats_grad: bool):
        ctx.set_materialize_grads(False)
        B, H, T, d = v.shape
        x = logits + bias if bias is not None else logits.clone()  # (B, H, T, T)
        alpha = torch.softmax(x.masked_fill_(~allowed, torch.finfo(x.dtype).min), dim=-1)
        del x
        alpha.mul_(allowed.any(-1, keepdim=True))  # a row with no allowed key: all 0 (masked_softmax)
        vv = torch.cat([v, v * v], dim=-1)  # (B, H, T, 2d)
        mom = alpha @ vv  # (B, H, T, 2d)
        m = mom[..., :d].contiguous()  # (B, H, T, d)
        S = torch.relu_(mom[..., d:].addcmul_(m, m, value=-1.0))  # (B, H, T, d) view of mom, clamped at 0
        a2 = (alpha * alpha).sum(-1)  # (B, H, T)
        b = torch.rsub(alpha, 1.0).mul_(alpha).sum(-1)  # Σ α̃(1 − α̃), elementwise, exact to rounding (kish_b)
        bi, ti = rows // T, rows % T  # (n,) batch and position of each valid row
        S_r, a2_r, b_r = S[bi, :, ti], a2[bi, :, ti], b[bi, :, ti]  # (n, H, d), (n, H), (n, H)
        dmask = None
        if train and p > 0:
            drop, dmask = torch.ops.aten.native_dropout(alpha, p, True)  # (B, H, T, T) float, bool
            mv = drop @ v  # (B, H, T, d): dropout on α̃ as in the native layer
            del drop
        else:
            mv = m
        ctx.save_for_backward(alpha, v, m, S_r > 0, rows, dmask)
        ctx.p, ctx.stats_grad, ctx.mv_is_m = p, stats_grad, dmask is None
        if not stats_grad:  # bft.detach_precision_grad: the statistics carry no gradient
            ctx.mark_non_differentiable(S_r, a2_r, b_r)
        ctx.mark_non_differentiable(a2)
        return mv, S_r, a2_r, b_r, a2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mv, g_S, g_a2, g_b, _g_a2_full):
        alpha, v, m, pos, rows, dmask = ctx.saved_tensors
        B, H, T, d = v.shape
        bi, ti = rows // T, rows % T
        if not ctx.stats_grad:
            g_S = g_a2 = g_b = None
        gm = gS = None  # gradients of m = α̃ @ v and of m2 = α̃ @ (v⊙v), (B, H, T, d) each
        if g_S is not None:
            gS = m.new_zeros(B, H, T, d)
            gS[bi, :, ti] = g_S * pos  # the clamp at 0 passes no gradient where it binds
            gm = gS * m * -2.0  # S = m2 − m²
        if ctx.mv_is_m and g_mv is not None:
            gm = g_mv if gm is None else gm.add_(g_mv)
        scale = 1.0 / (1.0 - ctx.p) if dmask is not None else 1.0
        g_alpha = None if gm is None else gm @ v.transpose(-2, -1)  # (B, H, T, T)
        if gS is not None:  # + gS @ (v⊙v)ᵀ, in place, no [v, v⊙v] copy
            g_alpha.view(B * H, T, T).baddbmm_(gS.view(B * H, T, d), (v * v).view(B * H, T, d).transpose(1, 2))
        if dmask is not None and g_mv is not None:
            gd = torch.ops.aten.native_dropout_backward(g_mv @ v.transpose(-2, -1), dmask, scale)  # (B, H, T, T)
            g_alpha = gd if g_alpha is None else g_alpha.add_(gd)
            del gd
        if g_a2 is not None or g_b is not None:
            ga2 = alpha.new_zeros(B, H, T)
            gb = alpha.new_zeros(B, H, T)
            if g_a2 is not None:
                ga2[bi, :, ti] = g_a2
            if g_b is not None:
                gb[bi, :, ti] = g_b
            k = (ga2 - gb).mul_(2.0)[..., None]  # 2(∂a2 − ∂b)
            if g_alpha is None:
                g_alpha = torch.addcmul(gb[..., None].expand_as(alpha), alpha, k)
            else:
                g_alpha.add_(gb[..., None]).addcmul_(alpha, k)  # + 2α̃∂a2 + (1 − 2α̃)∂b
        g_logits = g_bias = g_v = None
        if g_alpha is not None:
            # softmax backward α̃ ⊙ (g − Σ α̃ g); α̃ = 0 on masked keys and on rows without keys: gradient 0 there
            g_logits = torch._softmax_backward_data(g_alpha, alpha, -1, alpha.dtype)
            del g_alpha
            if ctx.needs_input_grad[1]:
                g_bias = g_logits.sum((1, 2), keepdim=True)  # (B, 1, 1, T)
            if not ctx.needs_input_grad[0]:
                g_logits = None
        if ctx.needs_input_grad[3]:
            at = alpha.transpose(-2, -1)
            if gm is not None:
                g_v = at @ gm  # (B, H, T, d)
            if gS is not None:
                g_v.addcmul_(v, at @ gS, value=2.0)  # ∂(v⊙v)/∂v = 2v
            if dmask is not None and g_mv is not None:
                gdv = torch.ops.aten.native_dropout_backward(alpha, dmask, scale).transpose(-2, -1) @ g_mv
                g_v = gdv if g_v is None else g_v.add_(gdv)
        return g_logits, g_bias, None, g_v, None, None, None, None


def kriging_attention(logits: torch.Tensor, bias: Optional[torch.Tensor], allowed: torch.Tensor, v: torch.Tensor,
                      rows: torch.Tensor, p: float = 0.0, train: bool = False, stats_grad: bool = True):
    """Kriging attention and its statistics as one lean autograd node (BFT.md §1; the layer's fast path).

    Same values and gradients as the reference (``masked_softmax(logits + bias, allowed)``, then
    ``nn.Dropout(p)(α̃) @ v`` for the value path, ``kriging_stats(α̃, v)`` and ``gather_head_rows``),
    unit-tested to float rounding; with dropout the mask comes from ``aten.native_dropout``.

    Args:
        logits: (B, H, T, T) float32 scaled logits ``q kᵀ/√d``; bias: (B, 1, 1, T) float32 kriging bias
            (``kriging_bias``) or None; allowed: (B, 1, T, T) bool (may attend ∧ key valid).
        v: (B, H, T, d) float32 values; rows: (n,) int64 valid positions (``valid_rows``).
        p, train: attention dropout probability and whether it is active (``nn.Dropout.training``).
        stats_grad: False under ``bft.detach_precision_grad``: S, a2, b carry no gradient (the value
            path and the bias still do, as in the reference).
    Returns:
        m_v (B, H, T, d) value-path mean ``drop(α̃) @ v`` (the undropped ``m`` without dropout);
        S (n, H, d), a2 (n, H), b (n, H) on the valid rows; a2 (B, H, T) without gradient (for ``kish_n``).
    """
    return _KrigingAttention.apply(logits, bias, allowed, v, rows, float(p), bool(train), bool(stats_grad))


def observe_from_stats(S_r: torch.Tensor, a2_r: torch.Tensor, b_r: torch.Tensor, ok_r: torch.Tensor,
                       s0sq: torch.Tensor, w_out: torch.Tensor, prior_dof: float, lo: float = 1e-8,
                       hi: float = 1e8, want_prior: bool = False, set_prior=None, count: bool = False):
    """The rest of ``observe_precision`` from row statistics (``kriging_attention``): REML shrinkage,
    heads concatenated, ``output_precision`` (BFT.md §1, §7).

    Args:
        S_r (n, H, d), a2_r, b_r (n, H): statistics of the valid rows; ok_r (n, 1|H) bool.
        s0sq, w_out, prior_dof, lo, hi, want_prior, set_prior, count: as ``observe_precision``.
    Returns:
        λ^obs (n, D) rows, prior sums ``(total (H, d), count (H,))`` or None.
    """
    H, d = S_r.shape[1], S_r.shape[2]
    prior = None
    if want_prior or set_prior is not None:
        with torch.no_grad():
            prior = prior_statistic(S_r.detach(), a2_r.detach(), b_r.detach(), ok_r)
    if set_prior is not None:
        s0sq = set_prior(*prior)
    var_m = reml_shrinkage(S_r, a2_r, b_r, s0sq, prior_dof, ok_r).reshape(-1, H * d)  # (n, H, d) -> (n, D)
    one_obs = s0sq.reshape(H * d) if count else None  # (H, d) -> (D,): Var(m) of one value at the prior scale
    return output_precision(var_m, w_out, lo, hi, ok_r.any(1), one_obs), prior


def kish_n(a2: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """(B, H, T) ``Σ α̃²`` and ok (B, 1|H, T) bool -> (B, T) Kish ``n = 1/Σα̃²`` averaged over heads, 0 where not ok
    (the ``n_eff`` mechanism statistic, BFT.md §6)."""
    ok = ok.expand_as(a2)
    n = torch.where(ok, 1.0 / torch.where(ok, a2, torch.ones_like(a2)), torch.zeros_like(a2))  # (B, H, T)
    return n.mean(1)
