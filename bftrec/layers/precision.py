"""Pure precision math of the BFT layer (``docs/BFT.md``, cited below as BFT.md).

Every function here is stateless and backbone-agnostic, so the pre-LN (SASRec), post-LN (BERT4Rec)
and sandwich (HSTU) twins (``bftrec/models/*_bft.py``) share one implementation of each formula; §4's
estimator for non-normalised (pointwise) attention weights is here too.
Labels follow BFT.md: **[paper]** = stated by the paper's summary, **[bftrec]** = our completion.

Conventions (BFT.md "Notation and shapes"):
- ``B`` batch, ``T`` length, ``D`` width, ``H`` heads, ``d = D/H``, ``F`` FFN width.
- **Padding is handled by the explicit boolean mask** ``valid`` (B, T) (``True`` = real token). Per-token
  precision quantities (λ, λ^obs, K, J) are stored compactly as **rows**: an (n, D) tensor for the n
  valid positions, in the order of ``rows = valid_rows(valid)`` (flat indices ``b·T + t``). Padding
  positions have no row, so no precision is ever computed for them, nothing is ever ``log 0``, and
  ``scatter_rows`` gives them exactly ``λ = 0`` and ``K = 0`` when a (B, T, ·) view is needed.
- Attention-level quantities keep their (B, H, T, ·) shapes; a query row with no valid key has
  all-zero weights and is masked (``ok``).
- Clamps ``[lo, hi]`` (default ``[1e-8, 1e8]``) apply to rows, i.e. valid positions only.

Functions take whatever floating dtype they are given (the unit tests use float64); the layer calls
them with float32 tensors and with autocast disabled.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

__all__ = [
    "valid_rows", "gather_rows", "scatter_rows", "gather_head_rows",
    "log_mean_precision", "geometric_mean_d", "kriging_bias", "kriging_moments", "kish_b", "kish_sums",
    "kriging_stats", "reml_shrinkage",
    "prior_statistic", "output_precision", "observe_precision", "kriging_attention", "observe_from_stats", "kish_n",
    "relative_reliability", "sandwich_stats", "sandwich_variance", "gated_output_precision",
    "kalman_gain", "kalman_precision", "kalman_update",
    "gelu_prime", "ffn_jacobian_diag", "prenorm_ffn_jacobian_diag", "prenorm_ffn_jacobian_diag_fused",
    "predict_precision", "layernorm_precision",
]


# --------------------------------------------------------------------------------------------------
# Rows: the compact layout of per-token precision quantities
# --------------------------------------------------------------------------------------------------
def valid_rows(valid: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (n,) int64 ascending flat indices ``b·T + t`` of the valid positions (one host sync)."""
    return valid.reshape(-1).nonzero().squeeze(1)


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> (n, ...) the rows of the valid positions."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])[rows]  # (B, T, ...) -> (B·T, ...) -> (n, ...)


def scatter_rows(x: torch.Tensor, rows: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """(n, ...) -> (B, T, ...) with 0 on every position that has no row (padding)."""
    out = x.new_zeros(B * T, *x.shape[1:]).index_copy(0, rows, x)  # (B·T, ...)
    return out.view(B, T, *x.shape[1:])  # (B·T, ...) -> (B, T, ...)


def gather_head_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(B, H, T, ...) -> (n, H, ...): the query rows of the valid positions, all heads (no full copy)."""
    T = x.shape[2]
    return x[rows // T, :, rows % T]  # advanced indices on dims 0 and 2 -> (n, H, ...)


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


# --------------------------------------------------------------------------------------------------
# Observe with non-normalised weights (BFT.md §4: HSTU's pointwise attention)
# --------------------------------------------------------------------------------------------------
def relative_reliability(w: torch.Tensor, lam_bar: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``w̃_tj = w_tj · λ̄_j / mean_{j'∈keys(t)} λ̄_j'`` [bftrec] (BFT.md §4).

    The mean over the keys position ``t`` may see is a causal cumulative sum over the valid keys
    ``j' ≤ t`` (HSTU's mask is causal ∧ key-valid), so ``w̃`` at ``t`` never reads a later position.
    Uniform ``λ̄`` gives ``w̃ = w`` (up to rounding). Positions before the first valid key have no keys
    (their row of ``w`` is 0 and stays 0).

    Args:
        w: (B, H, T, T) float32 pointwise weights, exactly 0 where masked.
        lam_bar: (B, T) float32 ``λ̄_j > 0`` on valid positions (any finite value on padding).
        valid: (B, T) bool.
    Returns:
        (B, H, T, T) float32.
    """
    lb = torch.where(valid, lam_bar, torch.zeros_like(lam_bar))  # (B, T): padding is no key
    tot = lb.cumsum(-1)  # (B, T) Σ_{j' ≤ t, valid} λ̄_j'
    cnt = valid.to(lb.dtype).cumsum(-1)  # (B, T) number of such keys
    has = cnt > 0
    inv_mean = torch.where(has, cnt / torch.where(has, tot, torch.ones_like(tot)), torch.zeros_like(tot))  # (B, T)
    return w * lb[:, None, None, :] * inv_mean[:, None, :, None]  # (B, H, T, T)


def sandwich_stats(wt: torch.Tensor, v: torch.Tensor):
    """Center, sandwich (HC0) meat and Kish sums of non-normalised weights [paper; form bftrec] (BFT.md §4).

    With ``a₁ = Σ_j |w̃_tj|`` and the normalised magnitudes ``p = |w̃|/a₁`` (``Σ_j p = 1``):

    - center ``c_t = Σ_j |w̃_tj| v_j / a₁ = p @ v``;
    - meat ``M_t = Σ_j w̃²(v_j − c_t)² = (W² v²) − 2c ⊙ (W² v) + c² ⊙ rowsum(W²)`` with ``W² = w̃ ⊙ w̃ = a₁² p²``:
      the expanded square in one batched matmul of ``p²`` with ``[v, v⊙v]`` (no (B, H, T, T, d) tensor),
      clamped at ``≥ 0``. Returned as ``M/a₁²`` (scale-free, no underflow of tiny weights);
    - ``a2 = Σ p² = Σw̃²/a₁²`` (``n = (Σ|w̃|)²/Σw̃² = 1/a2``) and ``b = Σ p(1 − p)`` (``n − 1 = b/a2``,
      elementwise, never by subtraction, as BFT.md §1), as ``precision.kish_sums(p)`` (``kish_b``).

    A row with ``a₁ = 0`` (no valid key) gives all zeros and must be masked by the caller.

    Args:
        wt: (B, H, T, T) float weights ``w̃`` (any sign), 0 where masked.
        v: (B, H, T, d) float values.
    Returns:
        c (B, H, T, d), M/a₁² (B, H, T, d), a₁ (B, H, T), a2 (B, H, T), b (B, H, T).
    """
    d = v.shape[-1]
    aw = wt.abs()  # (B, H, T, T)
    a1 = aw.sum(-1)  # (B, H, T)
    p = aw / torch.where(a1 > 0, a1, torch.ones_like(a1))[..., None]  # (B, H, T, T), rows sum to 1 or 0
    c = p @ v  # (B, H, T, d)
    p2 = p * p  # (B, H, T, T) = W²/a₁², shared by the Kish sums and the moments
    a2, b = p2.sum(-1), kish_b(p)  # precision.kish_sums(p), reusing p²; b = Σ p(1 − p), exact to rounding
    mom = p2 @ torch.cat([v, v * v], dim=-1)  # (B, H, T, 2d) = [W²v, W²v²] / a₁²
    meat = torch.relu(mom[..., d:] - 2.0 * c * mom[..., :d] + c * c * a2[..., None])  # M / a₁²
    return c, meat, a1, a2, b


def sandwich_variance(meat: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, b: torch.Tensor, s0sq: torch.Tensor,
                      prior_dof: float, ok: torch.Tensor, want_prior: bool = False, set_prior=None):
    """``Var(m_t)`` by the conjugate shrinkage of BFT.md §4 [paper: inverse-χ² prior; form bftrec].

    ``n = (Σ|w̃|)²/Σw̃²``, ``σ̂² = M/Σw̃²``, ``σ² = (ν₀s₀² + nσ̂²)/(ν₀ + n − 1)``, ``Var(m) = σ²·Σw̃²``.
    In the scale-free quantities of ``sandwich_stats`` (``Σw̃² = a₁²·a2``, ``n = 1/a2``) this is
    ``σ̂² = (M/a₁²)/a2`` and ``Var(m) = a₁² · reml_shrinkage(σ̂², a2, b)`` (``reml_shrinkage`` returns
    ``σ²/n``). The ``s₀²`` statistic is §1's, with ``σ̂²`` in the place of ``S``: the mean of
    ``σ̂² n/(n − 1)`` over rows with ``n > 1.01`` (``prior_statistic``) [bftrec].

    Args:
        meat: (n, H, d) ``M/a₁²`` rows; a1, a2, b: (n, H) rows; s0sq: (H, d) prior scale before this forward.
        ok: (n, H) bool, rows with ``Σ|w̃| > 0`` (others are masked, not computed: ``Var(m) = 0``).
        want_prior / set_prior: as ``precision.observe_precision``.
    Returns:
        Var(m) (n, H, d) (0 where not ok), prior sums ``(total (H, d), count (H,))`` or None.
    """
    a2s = torch.where(ok, a2, torch.ones_like(a2))  # (n, H), a2 >= 1/T where ok
    sig_hat = meat / a2s[..., None]  # (n, H, d) σ̂² = M/Σw̃²
    prior = None
    if want_prior or set_prior is not None:
        with torch.no_grad():
            prior = prior_statistic(sig_hat.detach(), a2.detach(), b.detach(), ok)
    if set_prior is not None:
        s0sq = set_prior(*prior)
    a1s = torch.where(ok, a1, torch.zeros_like(a1))  # (n, H)
    return reml_shrinkage(sig_hat, a2, b, s0sq, prior_dof, ok) * (a1s * a1s)[..., None], prior


def gated_output_precision(var_m: torch.Tensor, u: torch.Tensor, m: torch.Tensor, ln_weight: torch.Tensor,
                           ln_eps: float, w_f2: torch.Tensor, lo: float, hi: float,
                           has_key: Optional[torch.Tensor] = None,
                           one_obs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Observation precision for ``o = f₂(LN(m) ⊙ u)`` [paper: delta method; form bftrec] (BFT.md §4 "Output", §7).

    Diagonal LayerNorm approximation: ``G_t[k,c] = f₂[k,c] · u_tc · γ_c/σ_m,t`` with
    ``σ_m = sqrt(var(m) + eps)`` per token of the undropped ``m``, ``Var(o)_k = Σ_c G[k,c]² Var(m)_c``:
    one matmul with ``f₂ ⊙ f₂`` (``precision.output_precision``). ``bft.units=h``: ``λ^obs = 1/Var(o)``;
    ``count`` (``one_obs`` given): ``λ̂^obs = Var₁(o)/Var(o)``, ``Var₁(o)_k = Σ_c G[k,c]² s₀²_c a_t²``.

    Args:
        var_m: (n, D) rows, heads concatenated; u: (n, D) gate rows; m: (n, D) LN input rows (undropped);
        ln_weight: (D,) γ of LN2; w_f2: (D, D) ``f2.weight``; has_key: optional (n,) bool;
        one_obs: optional (n, D) ``s₀²_c a_t²`` rows (``a_t = Σ_j |w̃_tj|`` of the head of coordinate c).
    Returns:
        (n, D) float; under ``h`` ``Var(o)`` is clamped to ``[lo, hi]``, under ``count`` the ratio.
    """
    inv_var = torch.rsqrt(m.var(-1, unbiased=False, keepdim=True) + ln_eps)  # (n, 1) = 1/σ_m
    g = u * ln_weight * inv_var  # (n, D)
    g2 = g * g
    return output_precision(var_m * g2, w_f2, lo, hi, has_key, None if one_obs is None else one_obs * g2)


# --------------------------------------------------------------------------------------------------
# Update (BFT.md §2)
# --------------------------------------------------------------------------------------------------
def kalman_gain(lam: torch.Tensor, lam_obs: torch.Tensor) -> torch.Tensor:
    """``K = λ^obs / (λ + λ^obs)`` elementwise [paper] (BFT.md §2).

    Args:
        lam, lam_obs: (n, D) float rows, ``λ > 0`` (clamped), ``λ^obs >= 0``.
    Returns:
        (n, D) float in ``[0, 1)``.
    """
    return lam_obs / (lam + lam_obs)


def kalman_precision(lam: torch.Tensor, lam_obs: torch.Tensor, hi: float = 1e8,
                     uniform: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Gain and updated precision of the Kalman update [paper] (BFT.md §2).

    ``K = λ^obs / (λ + λ^obs)`` and ``λ' = λ + λ^obs`` (clamped at ``hi``); ``uniform`` gives ``K = 1``
    (``bft.precision=uniform``: the standard residual) while λ' is still computed.

    Args:
        lam, lam_obs: (n, D) float32 rows, ``λ > 0``.
    Returns:
        K (n, D) float32 (``(1, 1)`` ones when uniform), λ' (n, D) float32.
    """
    tot = lam + lam_obs  # (n, D)
    K = lam_obs.new_ones(1, 1) if uniform else lam_obs / tot  # = kalman_gain(lam, lam_obs), sharing λ + λ^obs
    return K, tot.clamp(max=hi)


def kalman_update(h: torch.Tensor, o: torch.Tensor, lam: torch.Tensor, lam_obs: torch.Tensor, hi: float = 1e8,
                  uniform: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual as a Kalman update [paper] (BFT.md §2): ``h' = h + K ⊙ o``, ``λ' = λ + λ^obs``.

    The standard residual is the case ``K ≡ 1``.

    Args:
        h: (n, D) float hidden-state rows; o: (n, D) observation rows (already dropped out).
        lam, lam_obs: (n, D) float32 rows, ``λ > 0``.
    Returns:
        h' (n, D), λ' (n, D) float32, K (n, D) float32.
    """
    K, lam1 = kalman_precision(lam, lam_obs, hi, uniform)
    return torch.addcmul(h, K, o), lam1, K.expand_as(lam1)


# --------------------------------------------------------------------------------------------------
# Predict (BFT.md §3)
# --------------------------------------------------------------------------------------------------
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _ErfGeluPrime(torch.autograd.Function):
    """``φ'(z) = Φ(z) + z·pdf(z)`` for the exact (erf) GELU, with ``φ''(z) = pdf(z)(2 − z²)`` as backward.

    The forward is PyTorch's fused GELU-backward kernel with a unit upstream gradient (one pass);
    the backward is hand-written with in-place arithmetic. Only ``z`` (shared with the FFN) is saved.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z)
        # a materialised ones tensor: a stride-0 expand makes the CPU kernel ~6x slower
        return torch.ops.aten.gelu_backward(torch.ones_like(z), z, approximate="none")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (z,) = ctx.saved_tensors
        t = z * z
        c = 1.0 / _SQRT_2PI
        return torch.exp(t * -0.5).mul_(t.mul_(-c).add_(2.0 * c)).mul_(grad)  # pdf(z)(2 − z²) · grad


def gelu_prime(z: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Derivative of ``nn.GELU(approximate=...)`` at ``z`` (any shape, any float dtype).

    ``none``: ``Φ(z) + z·pdf(z)``; ``tanh``: derivative of ``0.5 z (1 + tanh(√(2/π)(z + 0.044715 z³)))``.
    """
    if approximate == "none":
        return _ErfGeluPrime.apply(z)
    if approximate == "tanh":
        u = _SQRT_2_OVER_PI * (z + 0.044715 * z ** 3)
        t = torch.tanh(u)
        du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * z * z)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du
    raise ValueError(f"GELU approximate={approximate!r} is not supported; use 'none' or 'tanh'")


def ffn_jacobian_diag(z: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``J = diag(W₂ diag(φ'(z)) W₁)`` [paper] (BFT.md §3, post-LN backbones: no LayerNorm term).

    ``J_i = Σ_f W₂[i,f] φ'(z_f) W₁[f,i] = φ'(z) @ (W₂ᵀ ⊙ W₁)``: one F×D matmul.

    Args:
        z: (..., F) pre-activation ``W₁y + b₁``.
        w1: (F, D), w2: (D, F) ``nn.Linear`` weights.
    Returns:
        (..., D).
    """
    return gelu_prime(z, approximate) @ (w2.t() * w1)  # (..., F) @ (F, D)


def prenorm_ffn_jacobian_diag(x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor, ln_eps: float,
                              w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, approximate: str = "none",
                              z: torch.Tensor | None = None) -> torch.Tensor:
    """Exact diagonal of ``∂FFN(LN(x))/∂x`` in closed form [bftrec] (BFT.md §3, pre-LN backbones).

    With ``W₁' = W₁ diag(γ)`` and the never-formed per-token ``A = W₂ diag(φ'(z)) W₁'``::

        J_i = (1/σ) (A_ii − (1/D) Σ_k A_ik − (x̂_i/D) Σ_k A_ik x̂_k)

    where ``A_ii = φ'(z) @ (W₂ᵀ ⊙ W₁')``, ``Σ_k A_ik = W₂ (φ'(z) ⊙ W₁'𝟙)`` and
    ``Σ_k A_ik x̂_k = W₂ (φ'(z) ⊙ W₁'x̂)``, with ``W₁'x̂ = z − b₁ − W₁β`` for free.

    The first two terms share the left factor ``φ'(z)``, so they fold into one weight-only (F, D)
    matrix ``W₂ᵀ ⊙ W₁' − (W₁'𝟙) W₂ᵀ / D``: ``J = (φ' @ M − x̂ ⊙ ((φ' ⊙ W₁'x̂) @ W₂ᵀ)/D)/σ``, two
    (…, F) @ (F, D) matmuls per token batch instead of BFT.md's three (same result, exact).
    This is the paper's diagonal (delta-method) approximation; off-diagonal terms are ignored.

    Args:
        x: (..., D) LayerNorm input (the state ``h'``).
        ln_weight, ln_bias: (D,) γ, β; ln_eps: LayerNorm eps.
        w1: (F, D), b1: (F,), w2: (D, F): ``nn.Linear`` parameters of the FFN.
        approximate: the GELU variant (``nn.GELU.approximate``).
        z: optional (..., F) pre-activation ``W₁ LN(x) + b₁`` already computed in the same dtype.
    Returns:
        J (..., D) in the dtype of ``x``.
    """
    D = x.shape[-1]
    xhat = F.layer_norm(x, (D,), eps=ln_eps)  # (..., D) = (x − μ)/σ
    inv_sigma = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + ln_eps)  # (..., 1) = 1/σ
    if z is None:
        z = F.linear(xhat * ln_weight + ln_bias, w1, b1)  # (..., F)
    w1p = w1 * ln_weight  # (F, D) = W₁ diag(γ)
    w2t = w2.t()  # (F, D)
    m_diag = w2t * w1p - w1p.sum(1, keepdim=True) * w2t / D  # (F, D): A_ii − (1/D) Σ_k A_ik, per φ'
    g = z + (-(b1 + F.linear(ln_bias, w1)))  # (..., F) = W₁'x̂; the sign flip is on (F,), also in backward
    phi = gelu_prime(z, approximate)  # (..., F)
    return torch.addcmul(phi @ m_diag, xhat, (phi * g) @ w2t, value=-1.0 / D) * inv_sigma


def _gelu_prime_nograd(z: torch.Tensor, approximate: str) -> torch.Tensor:
    """φ'(z) without autograd: the fused GELU-backward kernel with a unit upstream gradient, in place."""
    return torch.ops.aten.gelu_backward.grad_input(torch.ones_like(z), z, approximate=approximate,
                                                   grad_input=torch.empty_like(z))


def _gelu_second(z: torch.Tensor, approximate: str) -> torch.Tensor:
    """φ''(z) without autograd. erf: ``pdf(z)(2 − z²)``; tanh: ``(1 − t²)(u' + z(u'' − 2t u'²)/2)``
    with ``u = √(2/π)(z + a z³)``, ``t = tanh u``, ``a = 0.044715``."""
    if approximate == "none":
        t = z * z
        return torch.exp(t * -0.5).mul_(t.mul_(-1.0 / _SQRT_2PI).add_(2.0 / _SQRT_2PI))
    a, k = 0.044715, _SQRT_2_OVER_PI
    zz = z * z
    t = torch.tanh(k * (z + a * zz * z))
    du = k * (1.0 + 3 * a * zz)
    return (1.0 - t * t) * (du + 0.5 * z * (6 * k * a * z - 2.0 * t * du * du))


class _PrenormJacobian(torch.autograd.Function):
    """``prenorm_ffn_jacobian_diag`` with a hand-written backward, over valid tokens only, in chunks.

    Same value and gradients as the autograd reference (unit-tested with ``gradcheck``). It recomputes
    the pre-activation ``z = W₁ LN(x) + b₁`` on its rows (one (n, D) @ (D, F) matmul) rather than
    reading the FFN's ``z``, so its backward never forms a (B, T, F) gradient (a zero buffer, a scatter
    and a full add into the FFN's gradient): the gradient of ``z`` goes through ``W₁`` and the
    LayerNorm by hand, to ``x`` (B·T, D) and the weights. It saves only ``x`` (kept by the block
    anyway), ``J`` and one (n, D) product, and bounds the transient (…, F) tensors by ``chunk`` tokens.
    """

    @staticmethod
    def _weights(ln_w, ln_b, w1, b1, w2):
        D = w1.shape[1]
        w1p = w1 * ln_w  # (F, D) = W₁ diag(γ)
        w2t = w2.t()  # (F, D)
        r1 = w1p.sum(1)  # (F,) = W₁'𝟙
        m_diag = w2t * w1p - r1[:, None] * w2t / D  # (F, D)
        c = b1 + w1 @ ln_b  # (F,): W₁'x̂ = z − c
        return w1p, w2t, r1, m_diag, c

    @staticmethod
    def _norm(x, eps):
        """x (n, D) -> x̂ (n, D), s = 1/σ (n, 1)."""
        xc = x - x.mean(-1, keepdim=True)
        s = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
        return xc * s, s

    @staticmethod
    def forward(ctx, x, ln_w, ln_b, w1, b1, w2, eps: float, approximate: str, rows, chunk: int):
        """x (N, D) float; rows (n,) int64 token indices -> J (n, D) for those tokens."""
        N, D = x.shape
        _, w2t, _, m_diag, c = _PrenormJacobian._weights(ln_w, ln_b, w1, b1, w2)
        J = x.new_empty(len(rows), D)
        R = x.new_empty(len(rows), D)  # (φ' ⊙ W₁'x̂) @ W₂ᵀ per computed row, kept for backward
        for i in range(0, len(rows), chunk):
            idx = rows[i:i + chunk]
            xh, s = _PrenormJacobian._norm(x[idx], eps)  # (c, D), (c, 1) for a chunk of c rows
            g = xh @ (w1 * ln_w).t()  # (c, F) = W₁'x̂ = z − c
            phi = _gelu_prime_nograd(g + c, approximate)  # (c, F) = φ'(z)
            r = g.mul_(phi) @ w2t  # (c, D)
            R[i:i + chunk] = r
            J[i:i + chunk] = torch.addcmul(phi @ m_diag, xh, r, value=-1.0 / D).mul_(s)
        ctx.save_for_backward(x, ln_w, ln_b, w1, b1, w2, rows, J, R)
        ctx.eps, ctx.approximate, ctx.chunk = eps, approximate, chunk
        return J

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gJ):
        x, ln_w, ln_b, w1, b1, w2, rows, J, R = ctx.saved_tensors
        eps, approx, chunk = ctx.eps, ctx.approximate, ctx.chunk
        N, D = x.shape
        w1p, w2t, r1, m_diag, c = _PrenormJacobian._weights(ln_w, ln_b, w1, b1, w2)
        gx = x.new_zeros(N, D) if ctx.needs_input_grad[0] else None
        g_m = torch.zeros_like(m_diag)  # (F, D) grad of M
        g_w2t = torch.zeros_like(w2t)  # (F, D) grad of W₂ᵀ through R
        g_c = torch.zeros_like(c)  # (F,) grad of c through g = z − c
        g_w1z = torch.zeros_like(w1)  # (F, D) grad of W₁ through z = W₁ y + b₁
        g_b1z = torch.zeros_like(b1)  # (F,)
        g_lnw = torch.zeros_like(ln_w)  # (D,) through y = γ x̂ + β
        g_lnb = torch.zeros_like(ln_b)  # (D,)
        for i in range(0, len(rows), chunk):
            idx = rows[i:i + chunk]
            xh, s = _PrenormJacobian._norm(x[idx], eps)  # (c, D), (c, 1) for a chunk of c rows
            g = xh @ w1p.t()  # (c, F) = W₁'x̂
            zc = g + c  # (c, F) = z
            phi = _gelu_prime_nograd(zc, approx)  # (c, F)
            r = R[i:i + chunk]  # (c, D)
            gj = gJ[i:i + chunk]  # (c, D)
            A = gj * s  # (c, D): grad of P = φ' @ M
            gR = A * xh * (-1.0 / D)  # (c, D): grad of R
            rw = gR @ w2  # (c, F) = gR @ W₂
            g_m += phi.t() @ A
            g_w2t += (phi * g).t() @ gR
            g_g = rw * phi  # (c, F): grad of g
            g_c -= g_g.sum(0)
            g_z = torch.addcmul(A @ m_diag.t(), rw, g).mul_(_gelu_second(zc, approx)).add_(g_g)  # (c, F)
            g_y = g_z @ w1  # (c, D): through z = W₁ y + b₁, y = γ x̂ + β
            y = torch.addcmul(ln_b, xh, ln_w)  # (c, D)
            g_w1z += g_z.t() @ y
            g_b1z += g_z.sum(0)
            g_lnw += (g_y * xh).sum(0)
            g_lnb += g_y.sum(0)
            if gx is not None:
                g_xh = torch.addcmul(g_y * ln_w, A, r, value=-1.0 / D)  # (c, D): every path through x̂
                g_s = (gj * J[i:i + chunk]).sum(-1, keepdim=True) / s  # (c, 1)
                gxh = g_xh - g_xh.mean(-1, keepdim=True) - xh * (g_xh * xh).mean(-1, keepdim=True)
                gx[idx] = gxh * s - g_s * s * s * xh / D
        # through M = W₂ᵀ ⊙ W₁' − r1 W₂ᵀ/D, r1 = W₁'𝟙, W₁' = W₁ diag(γ), c = b₁ + W₁β
        g_w2t += g_m * w1p - r1[:, None] * g_m / D
        g_w1p = g_m * w2t - ((g_m * w2t).sum(1, keepdim=True) / D)  # (F, D), incl. the r1 path
        g_w1 = g_w1p * ln_w + g_c[:, None] * ln_b + g_w1z
        g_lnw += (g_w1p * w1).sum(0)
        g_lnb += w1.t() @ g_c
        return gx, g_lnw, g_lnb, g_w1, g_c + g_b1z, g_w2t.t(), None, None, None, None


def prenorm_ffn_jacobian_diag_fused(x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor, ln_eps: float,
                                    w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, approximate: str,
                                    rows: Optional[torch.Tensor] = None, chunk: int = 4096) -> torch.Tensor:
    """``prenorm_ffn_jacobian_diag`` (BFT.md §3, exact) as one autograd node with a hand-written backward.

    Computes ``J`` only on the tokens ``rows`` (padding needs none: it has no precision), ``chunk``
    tokens at a time, so no (B, T, F) tensor is ever formed, in forward or backward: the
    pre-activation is recomputed on the rows (``_PrenormJacobian``).

    Args:
        x: (B, T, D) LayerNorm input ``h'``.
        ln_weight, ln_bias: (D,); w1: (F, D); b1: (F,); w2: (D, F).
        rows: (n,) int64 flat token indices ``b·T + t`` to compute (e.g. ``valid.reshape(-1).nonzero()``),
            or None for all tokens.
    Returns:
        (n, D) J rows (``n = B·T`` when ``rows`` is None), in the dtype of ``x``.
    """
    B, T, D = x.shape
    xf = x.reshape(B * T, D)  # (B, T, D) -> (B·T, D)
    if rows is None:
        rows = torch.arange(B * T, device=x.device)
    return _PrenormJacobian.apply(xf, ln_weight, ln_bias, w1, b1, w2, ln_eps, approximate, rows, chunk)


def predict_precision(lam1: torch.Tensor, J: torch.Tensor | None, Q: torch.Tensor, lo: float = 1e-8,
                      hi: float = 1e8) -> torch.Tensor:
    """``λ'' = ((1 + J)²/λ' + Q)⁻¹`` [paper] (BFT.md §3); ``J = None`` gives HSTU's ``(1/λ' + Q)⁻¹``.

    Args:
        lam1: (n, D) float32 λ' rows (``> 0``).
        J: (n, D) float32 diagonal Jacobian rows, or None.
        Q: (D,) float32 process noise ``exp(θ_Q)``.
    Returns:
        (n, D) float32; the variance is clamped to ``[lo, hi]``.
    """
    var = (lam1.reciprocal() + Q) if J is None else torch.addcdiv(Q, (J + 1.0).square(), lam1)  # (n, D)
    return var.clamp(lo, hi).reciprocal()


def layernorm_precision(lam: torch.Tensor, x: torch.Tensor, ln_weight: torch.Tensor, ln_eps: float,
                        lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """Precision through a LayerNorm, diagonal delta method [paper] (BFT.md §2, post-LN backbones).

    ``λ ← λ · σ²_LN / γ²`` with ``σ²_LN = var(x) + eps`` of the LayerNorm input ``x`` per token.

    Args:
        lam: (n, D) float32 precision rows of ``x``; x: (n, D) LayerNorm input rows; ln_weight: (D,) γ.
    Returns:
        (n, D) float32, clamped to ``[lo, hi]``.
    """
    var = x.var(-1, unbiased=False, keepdim=True) + ln_eps  # (n, 1)
    g2 = (ln_weight * ln_weight).clamp_min(1e-30)  # (D,), safe
    return (lam * var / g2).clamp(lo, hi)
