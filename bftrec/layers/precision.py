"""Pure precision math of the BFT layer (``/work/shared/docs/BFT.md``, cited below as BFT.md).

Every function here is stateless and backbone-agnostic, so the pre-LN (SASRec), post-LN (BERT4Rec)
and sandwich (HSTU) variants in ``bftrec.layers.bft`` share one implementation of each formula.
Labels follow BFT.md: **[paper]** = stated by the paper's summary, **[bftrec]** = our completion.

Conventions (BFT.md "Notation and shapes"):
- ``B`` batch, ``T`` length, ``D`` width, ``H`` heads, ``d = D/H``, ``F`` FFN width.
- Precisions ``λ`` are (B, T, D) float32, ``> 0`` on valid positions and exactly 0 on padding.
- ``valid`` is a (B, T) bool mask (``True`` = real token). Padding is handled by this mask, never
  through ``log 0``; every division uses a safe denominator so that padding rows give neither NaN
  values nor NaN gradients.
- Clamps ``[lo, hi]`` (default ``[1e-8, 1e8]``) apply to valid positions only.

Functions take whatever floating dtype they are given (the unit tests use float64); the layer calls
them with float32 tensors and with autocast disabled.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "log_mean_precision", "kriging_bias", "kriging_moments", "kish_sums", "reml_shrinkage",
    "prior_statistic", "output_precision", "kalman_gain", "kalman_update", "gelu_prime",
    "ffn_jacobian_diag", "prenorm_ffn_jacobian_diag", "predict_precision", "layernorm_precision",
]


def _bcast(valid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T, 1...) bool broadcastable against ``like`` (B, T, ...)."""
    return valid.reshape(valid.shape + (1,) * (like.dim() - valid.dim()))  # (B, T, 1, ...)


# --------------------------------------------------------------------------------------------------
# Observe (BFT.md §1)
# --------------------------------------------------------------------------------------------------
def log_mean_precision(lam: torch.Tensor, valid: torch.Tensor, lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """``log λ̄_j = mean_D log clamp(λ_j)`` [bftrec] (BFT.md "Notation": geometric-mean summary).

    Args:
        lam: (B, T, D) float32 precision, 0 on padding.
        valid: (B, T) bool.
    Returns:
        (B, T) float32; 0 on padding (never ``log 0``).
    """
    safe = torch.where(_bcast(valid, lam), lam.clamp(lo, hi), torch.ones_like(lam))  # (B, T, D)
    return safe.log().mean(-1) * valid


def kriging_bias(lam: torch.Tensor, valid: torch.Tensor, lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """Additive attention-logit bias of the kriging weights [paper] (BFT.md §1).

    ``α̃_tj ∝ α_tj λ̄_j`` is a softmax over ``s_tj + log λ̄_j``. Padding keys get 0 here; they are
    removed by the attention mask (``masked_softmax``), which is BFT.md's ``where(valid_j, ·, -inf)``
    without ever forming ``-inf`` (no NaN gradients).

    Returns:
        (B, 1, 1, T) float32, broadcastable against (B, H, T, T) logits.
    """
    return log_mean_precision(lam, valid, lo, hi)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)


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
    return m, (m2 - m * m).clamp_min(0.0)


def kish_sums(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums behind the Kish effective sample size [bftrec] (BFT.md §1).

    ``n = 1/a2`` and ``n − 1 = b/a2`` with ``a2 = Σ_j α̃_j²`` and ``b = Σ_j α̃_j(1 − α̃_j)``.
    ``b`` is summed elementwise, never as ``1 − a2``: in float32 ``n − 1`` would collapse to 0 when
    one weight is ``1 − 1e-8``. (``α̃ − α̃²`` is used elementwise rather than ``α̃(1 − α̃)`` so that
    autograd saves no extra (B, H, T, T) tensor; both are exact to float rounding per element.)

    Args:
        alpha: (B, H, T, T) float, undropped kriging weights.
    Returns:
        a2 (B, H, T), b (B, H, T); both 0 on a row with no valid key.
    """
    a_sq = alpha * alpha  # (B, H, T, T) temporary
    return a_sq.sum(-1), (alpha - a_sq).sum(-1)


def reml_shrinkage(S: torch.Tensor, a2: torch.Tensor, b: torch.Tensor, s0sq: torch.Tensor, prior_dof: float,
                   ok: torch.Tensor) -> torch.Tensor:
    """Shrunk kriging variance and ``Var(m) = σ²/n`` [paper: REML + inverse-χ² prior; form bftrec] (BFT.md §1).

    ``σ²_t = (ν₀ s₀² + n_t S_t) / (ν₀ + n_t − 1)`` with ``n = 1/a2`` and ``n − 1 = b/a2``: the posterior
    scale of a scaled-inverse-χ²(ν₀, s₀²) prior updated with the REML estimate ``S n/(n−1)`` on
    ``n − 1`` degrees of freedom. Finite at ``n = 1``, where it returns ``s₀²``.

    Args:
        S: (B, H, T, d) float plug-in residual variance (``kriging_moments``).
        a2, b: (B, H, T) float from ``kish_sums``.
        s0sq: (H, d) float prior scale ``s₀²`` (the layer's buffer, value before this forward).
        prior_dof: ``ν₀ > 0``.
        ok: (B, H, T) bool, rows that have at least one valid key (others are masked, not computed).
    Returns:
        Var(m) (B, H, T, d), 0 where not ``ok``.
    """
    a2s = torch.where(ok, a2, torch.ones_like(a2))[..., None]  # (B, H, T, 1), safe
    n = 1.0 / a2s  # Kish n >= 1
    n_m1 = b[..., None] / a2s  # n - 1, never by subtraction
    sigma2 = (prior_dof * s0sq[None, :, None, :] + n * S) / (prior_dof + n_m1)  # (B, H, T, d)
    return sigma2 / n * ok[..., None]


def prior_statistic(S: torch.Tensor, a2: torch.Tensor, b: torch.Tensor, ok: torch.Tensor,
                    min_n: float = 1.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums for the ``s₀²`` update [bftrec] (BFT.md §1): the REML variance ``S n/(n−1) = S/b``.

    Averaged over rows with ``n > min_n`` (i.e. ``b > (min_n − 1) a2``).

    Args:
        S: (B, H, T, d); a2, b, ok: (B, H, T).
    Returns:
        total (H, d) float sum of ``S n/(n−1)`` over kept rows, count (H,) float number of kept rows.
    """
    keep = ok & (b > (min_n - 1.0) * a2)  # (B, H, T): n > min_n
    bs = torch.where(keep, b, torch.ones_like(b))[..., None]  # (B, H, T, 1), safe
    reml = S / bs * keep[..., None]  # (B, H, T, d)
    return reml.sum(dim=(0, 2)), keep.sum(dim=(0, 2)).to(S.dtype)  # (H, d), (H,)


def output_precision(var_m: torch.Tensor, w_out: torch.Tensor, valid: torch.Tensor, lo: float = 1e-8,
                     hi: float = 1e8) -> torch.Tensor:
    """``λ^obs = 1 / Var(o)`` with ``Var(o)_k = Σ_c W_O[k,c]² Var(m)_c`` [paper: delta method] (BFT.md §1).

    One matmul with ``W_O ⊙ W_O`` (the bias of the output projection is deterministic).

    Args:
        var_m: (B, T, D) float, heads concatenated.
        w_out: (D, D) float, ``nn.Linear`` weight of the output projection.
        valid: (B, T) bool.
    Returns:
        (B, T, D) float; ``Var(o)`` clamped to ``[lo, hi]`` on valid positions, 0 on padding.
    """
    var_o = F.linear(var_m, w_out * w_out)  # (B, T, D)
    keep = _bcast(valid, var_o)
    return torch.where(keep, 1.0 / var_o.clamp(lo, hi), torch.zeros_like(var_o))


# --------------------------------------------------------------------------------------------------
# Update (BFT.md §2)
# --------------------------------------------------------------------------------------------------
def kalman_gain(lam: torch.Tensor, lam_obs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``K = λ^obs / (λ + λ^obs)`` elementwise [paper] (BFT.md §2); 0 on padding.

    Args:
        lam, lam_obs: (B, T, D) float, ``>= 0``.
        valid: (B, T) bool.
    Returns:
        (B, T, D) float in ``[0, 1]``.
    """
    keep = _bcast(valid, lam)
    den = lam + lam_obs
    den = torch.where(keep & (den > 0), den, torch.ones_like(den))  # safe: no 0/0
    return torch.where(keep, lam_obs / den, torch.zeros_like(den))


def kalman_update(h: torch.Tensor, o: torch.Tensor, lam: torch.Tensor, lam_obs: torch.Tensor,
                  valid: torch.Tensor, gain: torch.Tensor | None = None,
                  hi: float = 1e8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual as a Kalman update [paper] (BFT.md §2).

    ``h' = h + K ⊙ o`` and ``λ' = λ + λ^obs`` (clamped at ``hi`` on valid positions; 0 on padding).

    Args:
        h: (B, T, D) float hidden state; o: (B, T, D) observation (already dropped out).
        lam, lam_obs: (B, T, D) float32.
        valid: (B, T) bool.
        gain: optional (B, T, D) or broadcastable gain overriding ``K`` (``bft.precision=uniform``
            passes 1 on valid positions, 0 on padding).
    Returns:
        h' (B, T, D), λ' (B, T, D) float32, K (B, T, D) float32.
    """
    K = kalman_gain(lam, lam_obs, valid) if gain is None else gain
    keep = _bcast(valid, lam)
    lam1 = torch.where(keep, (lam + lam_obs).clamp(max=hi), torch.zeros_like(lam))
    return h + K * o, lam1, K


# --------------------------------------------------------------------------------------------------
# Predict (BFT.md §3)
# --------------------------------------------------------------------------------------------------
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _ErfGeluPrime(torch.autograd.Function):
    """``φ'(z) = Φ(z) + z·pdf(z)`` for the exact (erf) GELU, with ``φ''(z) = pdf(z)(2 − z²)`` as backward.

    A custom Function so that autograd saves only ``z`` (the intermediates of ``Φ`` and ``pdf``
    would otherwise be kept as extra (B, T, F) tensors).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z)
        pdf = torch.exp(-0.5 * z * z) / _SQRT_2PI
        return 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0))) + z * pdf

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (z,) = ctx.saved_tensors
        pdf = torch.exp(-0.5 * z * z) / _SQRT_2PI
        return grad * pdf * (2.0 - z * z)


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
    ``Σ_k A_ik x̂_k = W₂ (φ'(z) ⊙ W₁'x̂)``, with ``W₁'x̂ = z − b₁ − W₁β`` for free. The first two terms
    share the left factor ``φ'(z)``, so they are folded into one weight-only (F, D) matrix
    ``W₂ᵀ ⊙ W₁' − (W₁'𝟙) W₂ᵀ / D``: two (…, F) @ (F, D) matmuls per token batch instead of three.
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
    mu = x.mean(-1, keepdim=True)  # (..., 1)
    xc = x - mu
    inv_sigma = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + ln_eps)  # (..., 1) = 1/σ
    xhat = xc * inv_sigma  # (..., D)
    if z is None:
        z = F.linear(xhat * ln_weight + ln_bias, w1, b1)  # (..., F)
    w1p = w1 * ln_weight  # (F, D) = W₁ diag(γ)
    w2t = w2.t()  # (F, D)
    m_diag = w2t * w1p - w1p.sum(1, keepdim=True) * w2t / D  # (F, D): A_ii − (1/D) Σ_k A_ik, per φ'
    g = z - (b1 + F.linear(ln_bias, w1))  # (..., F) = W₁'x̂
    phi = gelu_prime(z, approximate)  # (..., F)
    return (phi @ m_diag - xhat * ((phi * g) @ w2t) / D) * inv_sigma


def predict_precision(lam1: torch.Tensor, J: torch.Tensor | None, Q: torch.Tensor, valid: torch.Tensor,
                      lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """``λ'' = ((1 + J)²/λ' + Q)⁻¹`` [paper] (BFT.md §3); ``J = None`` gives HSTU's ``(1/λ' + Q)⁻¹``.

    Args:
        lam1: (B, T, D) float32 λ' (0 on padding).
        J: (B, T, D) float32 diagonal Jacobian, or None.
        Q: (D,) float32 process noise ``exp(θ_Q)``.
        valid: (B, T) bool.
    Returns:
        (B, T, D) float32; the variance is clamped to ``[lo, hi]`` on valid positions, 0 on padding.
    """
    keep = _bcast(valid, lam1)
    safe = torch.where(keep, lam1, torch.ones_like(lam1))
    gain = 1.0 if J is None else (1.0 + J) ** 2
    var = (gain / safe + Q).clamp(lo, hi)  # (B, T, D)
    return torch.where(keep, 1.0 / var, torch.zeros_like(var))


def layernorm_precision(lam: torch.Tensor, x: torch.Tensor, ln_weight: torch.Tensor, ln_eps: float,
                        valid: torch.Tensor, lo: float = 1e-8, hi: float = 1e8) -> torch.Tensor:
    """Precision through a LayerNorm, diagonal delta method [paper] (BFT.md §2, post-LN backbones).

    ``λ ← λ · σ²_LN / γ²`` with ``σ²_LN = var(x) + eps`` of the LayerNorm input ``x`` per token.

    Args:
        lam: (B, T, D) float32 precision of ``x``; x: (B, T, D) LayerNorm input.
        ln_weight: (D,) γ; valid: (B, T) bool.
    Returns:
        (B, T, D) float32, clamped to ``[lo, hi]`` on valid positions, 0 on padding.
    """
    var = x.var(-1, unbiased=False, keepdim=True) + ln_eps  # (B, T, 1)
    g2 = (ln_weight * ln_weight).clamp_min(1e-30)  # (D,), safe
    out = (lam * var / g2).clamp(lo, hi)
    return torch.where(_bcast(valid, lam), out, torch.zeros_like(out))
