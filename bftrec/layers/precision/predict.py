"""Predict (docs/BFT.md §3): the FFN as a dynamics model, its Jacobian diagonal J, process noise Q, LayerNorm.

Conventions (shapes, rows, clamps, dtypes): ``bftrec.layers.precision``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from bftrec.layers.precision.compile import compilable

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


@compilable
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


@compilable
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
