"""Observe with non-normalised weights (docs/BFT.md §4): the sandwich estimator of HSTU's pointwise attention.

Conventions (shapes, rows, clamps, dtypes): ``bftrec.layers.precision``.
"""
from __future__ import annotations

from typing import Optional

import torch

from bftrec.layers.precision.compile import compilable
from bftrec.layers.precision.observe import kish_b, output_precision, prior_statistic, reml_shrinkage


# --------------------------------------------------------------------------------------------------
# Observe with non-normalised weights (BFT.md §4: HSTU's pointwise attention)
# --------------------------------------------------------------------------------------------------
@compilable
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


@compilable
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
