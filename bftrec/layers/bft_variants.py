"""BFT twins of the post-LN ``BERT4RecBlock`` and of the pointwise ``HSTUBlock`` (``../shared/docs/BFT.md``).

Imported at the bottom of ``bftrec.layers.bft`` (so the variants are registered whenever ``layer=bft``
exists, i.e. whenever ``bftrec.models`` is imported). Labels follow BFT.md: **[paper]** = stated by the
paper's summary, **[bftrec]** = our completion. Shared pieces come from ``bftrec.layers.bft`` (config,
``BFTBlockMixin`` with ``θ_Q`` and the ``s₀²`` buffers, ``LayerRun``) and the pure formulas from
``bftrec.layers.precision``; the HSTU sandwich estimator of BFT.md §4 is defined here.

- ``BFTBERT4RecBlock``: kriging attention with the bidirectional (padding) mask and REML precision
  (BFT.md §1, the same ``observe_precision`` as SASRec), Kalman update inside LN1 with the §2 post-LN
  rule, predict with the post-LN Jacobian (§3, no LayerNorm term) and Q, then LN2 by the §2 rule.
- ``BFTHSTUBlock``: relative reliability, sandwich (HC0) estimator and conjugate shrinkage (BFT.md §4),
  output variance through ``f₂(LN(m) ⊙ u)``, Kalman update (§2), process-noise-only predict (§3).

Both keep the native parameter names (they subclass the native block), so a standard ``state_dict``
loads with ``strict=False`` and only the BFT extras (``theta_q``, ``s0sq``, ``s0sq_ready``, τ) missing.
``bft.precision=uniform`` gives back the native block exactly on valid positions (BFT.md §5.1).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from bftrec.layers import Masks
from bftrec.layers.bft import BFTBlockMixin, BFTParams, LayerRun, _fp32, _record, register_variant
from bftrec.layers.precision import (
    ffn_jacobian_diag,
    gather_head_rows,
    gather_rows,
    geometric_mean_d,
    kalman_precision,
    kish_b,
    layernorm_precision,
    log_mean_precision,
    output_precision,
    predict_precision,
    prior_statistic,
    reml_shrinkage,
    scatter_rows,
    valid_rows,
)
from bftrec.models.bert4rec import BERT4RecBlock
from bftrec.models.hstu import HSTUBlock

__all__ = ["BFTBERT4RecBlock", "BFTHSTUBlock", "relative_reliability", "sandwich_stats", "sandwich_variance",
           "gated_output_precision"]


def _kish_n(a2: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """(B, H, T) ``Σ p²`` and ok -> (B, T) Kish ``n = 1/Σp²`` averaged over heads, 0 where not ok."""
    n = torch.where(ok, 1.0 / torch.where(ok, a2, torch.ones_like(a2)), torch.zeros_like(a2))  # (B, H, T)
    return n.mean(1)


# --------------------------------------------------------------------------------------------------
# BERT4Rec: post-LN (BFT.md §1, §2 post-LN rule, §3 post-LN Jacobian)
# --------------------------------------------------------------------------------------------------
@register_variant(BERT4RecBlock)
class BFTBERT4RecBlock(BFTBlockMixin, BERT4RecBlock):
    """BFT twin of the post-LN ``BERT4RecBlock``: observe → update (inside LN1) → predict (inside LN2).

    Same parameters as the native block (``attn.qkv``, ``attn.out``, ``ln1``, ``ffn.w1``, ``ffn.w2``,
    ``ln2``) plus ``theta_q`` and the ``s0sq`` buffers. Forward (λ rows of the valid positions)::

        q, k, v = heads(h)                                            # no pre-LN (post-LN block)
        α̃ = masked_softmax(q kᵀ/√d + log λ̄_key), padding mask only    # kriging, bidirectional [paper]
        λ^obs from α̃, v, s₀², W_O exactly as BFTSASRecBlock            # BFT.md §1
        K = λ^obs/(λ + λ^obs); x₁ = h + K⊙drop(W_O drop(α̃) v); h' = LN1(x₁)              # §2 [paper]
        λ' = (λ + λ^obs) · σ²_LN1(x₁)/γ₁²                              # §2 post-LN rule [paper]
        x₂ = h' + drop(FFN(h')); h'' = LN2(x₂)
        J = diag(W₂ diag(φ'(z)) W₁), z = W₁h' + b₁                    # §3 post-LN: no LN term
        λ'' = ((1 + J)²/λ' + Q)⁻¹ · σ²_LN2(x₂)/γ₂²                     # §3 then the §2 rule

    Q is the process noise of the dynamics ``x₂ = h' + FFN(h')``, so it is added before LN2 (BFT.md §3:
    "then the LayerNorm rule of §2"). ``[MASK]`` has its own τ row (the stack's table has N + 2 rows).
    Padding positions get ``K = 0`` (``x₁ = h`` there) and carry no λ row; the native block adds the
    attention output there too, but padding is never a key nor a scored position, so with
    ``bft.precision=uniform`` (zero bias, K = 1) all scores equal the native model's (BFT.md §5.1).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float, *,
                 bft_cfg: BFTParams) -> None:
        super().__init__(d_model, n_heads, d_ff, dropout, attn_dropout)
        if not isinstance(self.ffn.act, nn.GELU):
            raise TypeError("BFTBERT4RecBlock's Jacobian needs a GELU FFN")
        self.init_bft(d_model, n_heads, bft_cfg)

    def forward(self, h: torch.Tensor, lam: torch.Tensor, masks: Masks, run: Optional[LayerRun] = None,
                **ctx) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """One filtering cycle; same contract as ``BFTSASRecBlock.forward``.

        Args:
            h: (B, T, D) float; lam: (n, D) float32 λ rows of ``run.rows``; masks: padding-only ``Masks``.
        Returns:
            h'' (B, T, D); λ'' (n, D) float32 or None (``run.need_lam`` False); stats (``prior`` in
            training; ``K`` (n,) row means, ``lam_obs`` (n,) row geometric means and ``n_eff`` (B, T) when
            ``run.want_stats``).
        """
        run = run or LayerRun()
        cfg = self.bft_cfg
        lo, hi = cfg.clamp_min, cfg.clamp_max
        learned, detach = cfg.precision == "learned", cfg.detach_precision_grad
        valid = masks.valid  # (B, T)
        rows = valid_rows(valid) if run.rows is None else run.rows  # (n,)
        B, T, D = h.shape
        dev = h.device.type
        stats: dict = {}
        _record(run.probe, "lam", lam)

        # ---- observe: kriging attention, bidirectional padding mask (BFT.md §1); post-LN reads h itself
        o, lam_obs, ok, a2 = self.kriging_observe(h, lam, masks, run, rows, stats)

        # ---- update: Kalman update inside LN1, then the post-LN rule (BFT.md §2)
        with _fp32(dev):
            K, lam_sum = kalman_precision(lam, lam_obs, hi, not learned)  # (n, D) or (1, 1); (n, D)
            delta = K * gather_rows(self.drop(o), rows)  # (n, D) = K ⊙ drop(o)
        x1 = h.reshape(B * T, D).index_add(0, rows, delta.to(h.dtype)).view(B, T, D)  # padding: K = 0
        del o, delta
        h1 = self.ln1(x1)  # (B, T, D)
        _record(run.probe, "lam1_sum", lam_sum)
        with _fp32(dev):
            x1_r, g1 = gather_rows(x1, rows).float(), self.ln1.weight.float()  # (n, D), (D,)
            if detach:
                x1_r, g1 = x1_r.detach(), g1.detach()
            lam1 = layernorm_precision(lam_sum, x1_r, g1, self.ln1.eps, lo, hi)  # (n, D)
        _record(run.probe, "lam1", lam1)

        # ---- predict: FFN dynamics with process noise, then LN2 (BFT.md §3 post-LN, §2 rule)
        z = self.ffn.w1(h1)  # (B, T, F)
        x2 = h1 + self.drop(self.ffn.w2(self.ffn.act(z)))  # (B, T, D)
        h2 = self.ln2(x2)
        lam2 = None
        if run.need_lam:
            with _fp32(dev):
                f1, f2 = self.ffn.w1, self.ffn.w2
                w1, b1, w2, g2 = f1.weight.float(), f1.bias.float(), f2.weight.float(), self.ln2.weight.float()
                if z.dtype == torch.float32:
                    z_r = gather_rows(z, rows)  # (n, F)
                else:  # AMP: the Jacobian needs the pre-activation in float32
                    z_r = F.linear(gather_rows(h1, rows).float(), w1, b1)  # (n, F)
                x2_r = gather_rows(x2, rows).float()  # (n, D)
                if detach:
                    z_r, w1, w2, g2, x2_r = z_r.detach(), w1.detach(), w2.detach(), g2.detach(), x2_r.detach()
                J = ffn_jacobian_diag(z_r, w1, w2, self.ffn.act.approximate)  # (n, D), no LN term
                lam_pred = predict_precision(lam1, J, self.process_noise(), lo, hi)  # (n, D)
                _record(run.probe, "lam2_pred", lam_pred)
                lam2 = layernorm_precision(lam_pred, x2_r, g2, self.ln2.eps, lo, hi)  # (n, D)
            _record(run.probe, "lam2", lam2)
        if run.want_stats:
            stats.update({"K": K.detach().expand_as(lam1).mean(-1), "lam_obs": geometric_mean_d(lam_obs.detach()),
                          "n_eff": _kish_n(a2, ok.expand_as(a2)).detach()})
        return h2, lam2, stats


# --------------------------------------------------------------------------------------------------
# HSTU: relative reliability and the sandwich estimator (BFT.md §4)
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


@register_variant(HSTUBlock)
class BFTHSTUBlock(BFTBlockMixin, HSTUBlock):
    """BFT twin of ``HSTUBlock``: pointwise attention as a sandwich-estimated observation (BFT.md §4).

    Same parameters as the native block (``ln1``, ``attn.uvqk``, ``attn.rab``, ``ln2``, ``f2``) plus
    ``theta_q`` and the ``s0sq`` buffers. Forward (λ rows of the valid positions)::

        u, q, k, v = SiLU(uvqk(LN1 h)); w = SiLU(q kᵀ + rab)/N_t, masked  # native (pre-dropout)
        w̃_tj = w_tj λ̄_j / mean_{j'≤t valid} λ̄_j'                        # relative reliability [bftrec]
        m = drop(w̃) @ v                                                  # estimate
        c = |w̃| v/Σ|w̃|; M = W²v² − 2c W²v + c² ΣW², W² = w̃⊙w̃             # sandwich HC0 [paper; form bftrec]
        n = (Σ|w̃|)²/Σw̃²; σ² = (ν₀s₀² + n M/Σw̃²)/(ν₀ + n − 1); Var(m) = σ² Σw̃²
        λ^obs = 1/((f₂⊙f₂)(Var(m) ⊙ (u γ/σ_m)²))                         # delta method, diagonal LN (units=h)
        λ̂^obs = (f₂⊙f₂)(s₀² a² ⊙ (u γ/σ_m)²) / idem(Var(m)), a = Σ|w̃|    # units=count (§7); σ_m of undropped m
        K = λ^obs/(λ + λ^obs); h' = h + K ⊙ f₂(drop(LN2(m) ⊙ u)); λ' = λ + λ^obs   # §2 [paper]
        λ'' = (1/λ' + Q)⁻¹                                               # §3, HSTU: no FFN [paper]

    A row with ``Σ|w̃| = 0`` (no valid key) gets ``λ^obs = 0``, hence ``K = 0`` (learned precision). The
    test is per head (``w̃`` is): a head whose row is empty has ``m = 0`` exactly and adds no variance,
    and a position gets ``λ^obs = 0`` when the rows of all its heads are empty (keys are shared by heads,
    so in practice all or none are). ``bft.precision=uniform``: ``w̃ = w`` and ``K = 1`` (λ still
    computed): the native block on valid positions (BFT.md §5.1). ``s₀²`` follows §1's semantics
    (``BFTBlockMixin``), with the statistic of ``sandwich_variance``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, attn_dropout: float, max_len: int,
                 attn_norm: str, n_time_buckets: int, init_std: float, *, bft_cfg: BFTParams) -> None:
        super().__init__(d_model, n_heads, dropout, attn_dropout, max_len, attn_norm, n_time_buckets, init_std)
        self.init_bft(d_model, n_heads, bft_cfg)

    def forward(self, h: torch.Tensor, lam: torch.Tensor, masks: Masks, run: Optional[LayerRun] = None,
                time: Optional[torch.Tensor] = None, **ctx) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """One filtering cycle; same contract as ``BFTSASRecBlock.forward`` (plus HSTU's ``time`` (B, T) int64).

        ``masks.attn`` must be causal ∧ key-valid (``build_masks(causal=True)``): the relative-reliability
        mean runs over the valid keys ``j ≤ t``.
        """
        run = run or LayerRun()
        cfg = self.bft_cfg
        lo, hi = cfg.clamp_min, cfg.clamp_max
        learned, detach = cfg.precision == "learned", cfg.detach_precision_grad
        valid = masks.valid  # (B, T)
        rows = valid_rows(valid) if run.rows is None else run.rows  # (n,)
        B, T, D = h.shape
        H = self.attn.n_heads
        d = D // H
        dev = h.device.type
        s0sq = self.s0sq.detach().float().clone().view(H, d)  # value before this forward; (D,) -> (H, d)
        stats: dict = {}
        _record(run.probe, "lam", lam)

        # ---- observe: relative reliability and the sandwich estimator (BFT.md §4)
        u, q, k, v = self.attn.project(self.ln1(h))  # u (B, T, D); q, k, v (B, H, T, d)
        w = self.attn.weights(q, k, masks, time)  # (B, H, T, T), 0 where masked
        with _fp32(dev):
            wt = w.float()
            if learned:
                lam_bar = scatter_rows(log_mean_precision(lam, lo, hi).exp(), rows, B, T)  # (B, T), 0 on padding
                wt = relative_reliability(wt, lam_bar, valid)  # (B, H, T, T)
            w_p, v_p = (wt.detach(), v.detach().float()) if detach else (wt, v.float())
            c, meat, a1, a2, b = sandwich_stats(w_p, v_p)  # (B, H, T, ·)
            del c
            ok = (a1 > 0) & valid[:, None, :]  # (B, H, T): Σ|w̃| = 0 is "no valid key"
            ok_r = gather_head_rows(ok, rows)  # (n, H)
            setter = None
            if run.calibrate:
                def setter(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
                    self.set_prior(total, count)
                    return self.s0sq.float().clone().view(H, d)  # (D,) -> (H, d)
            var_m, prior = sandwich_variance(
                gather_head_rows(meat, rows), gather_head_rows(a1, rows), gather_head_rows(a2, rows),
                gather_head_rows(b, rows), s0sq, cfg.prior_dof, ok_r,
                want_prior=self.training and not run.calibrate, set_prior=setter)  # (n, H, d)
            if prior is not None and not run.calibrate:
                stats["prior"] = prior
            del meat
        w_v = wt.to(v.dtype) if learned else w  # (B, H, T, T)
        m = self.attn.attn_drop(w_v) @ v  # (B, H, T, d), native dropout
        m = m.transpose(1, 2).reshape(B, T, D)  # (B, H, T, d) -> (B, T, D)
        if self.training and self.attn.attn_drop.p > 0:  # σ_m of §4 is a property of the estimate, not of a draw
            m_u = (w_v @ v).transpose(1, 2).reshape(B, T, D)  # (B, H, T, d) -> (B, T, D), undropped
        else:
            m_u = m
        with _fp32(dev):
            u_r, m_r = gather_rows(u, rows).float(), gather_rows(m_u, rows).float()  # (n, D)
            g2, w_f2 = self.ln2.weight.float(), self.f2.weight.float()
            if detach:
                u_r, m_r, g2, w_f2 = u_r.detach(), m_r.detach(), g2.detach(), w_f2.detach()
            one_obs = None
            if cfg.units == "count":  # Var₁(o): one value at the prior scale, a_t = Σ_j |w̃_tj| (BFT.md §7)
                s0_used = self.s0sq.float().view(H, d) if run.calibrate else s0sq  # (H, d), as sandwich_variance used
                a1_r = torch.where(ok_r, gather_head_rows(a1, rows), torch.zeros_like(ok_r, dtype=a1.dtype))  # (n, H)
                one_obs = (s0_used[None] * (a1_r * a1_r)[..., None]).reshape(-1, D)  # (n, H, d) -> (n, D)
            lam_obs = gated_output_precision(var_m.reshape(-1, D), u_r, m_r, g2, self.ln2.eps, w_f2, lo, hi,
                                             ok_r.any(1), one_obs)  # (n, D)
        _record(run.probe, "lam_obs", lam_obs)
        o = self.f2(self.drop(self.ln2(m) * u))  # (B, T, D): the native output, dropout included

        # ---- update: residual as a Kalman update (BFT.md §2); padding: K = 0, h' = h
        with _fp32(dev):
            K, lam1 = kalman_precision(lam, lam_obs, hi, not learned)  # (n, D) or (1, 1); (n, D)
            delta = K * gather_rows(o, rows)  # (n, D)
        h1 = h.reshape(B * T, D).index_add(0, rows, delta.to(h.dtype)).view(B, T, D)
        _record(run.probe, "lam1", lam1)

        # ---- predict: process noise only (BFT.md §3, HSTU has no FFN)
        lam2 = None
        if run.need_lam:
            with _fp32(dev):
                lam2 = predict_precision(lam1, None, self.process_noise(), lo, hi)  # (n, D)
            _record(run.probe, "lam2", lam2)
        if run.want_stats:
            stats.update({"K": K.detach().expand_as(lam1).mean(-1), "lam_obs": geometric_mean_d(lam_obs.detach()),
                          "n_eff": _kish_n(a2, ok).detach()})
        return h1, lam2, stats
