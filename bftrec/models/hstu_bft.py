"""BFT twin of ``HSTUBlock``: pointwise attention as a sandwich-estimated observation (BFT.md §4, §7).

Registered for ``layer=bft`` / ``layer=bft_h`` when this module is imported (``bftrec/models/__init__.py``).
Labels follow BFT.md: **[paper]** = stated by the paper's summary, **[bftrec]** = our completion.
Relative reliability, sandwich (HC0) estimator and conjugate shrinkage (``precision.relative_reliability``,
``sandwich_stats``, ``sandwich_variance``), output variance through ``f₂(LN(m) ⊙ u)``
(``precision.gated_output_precision``), Kalman update (§2), process-noise-only predict (§3). It keeps the
native parameter names (it subclasses the native block); ``bft.precision=uniform`` gives back the native
block exactly on valid positions (BFT.md §5.1).
"""
from __future__ import annotations

from typing import Optional

import torch

from bftrec.layers import Masks
from bftrec.layers.bft import BFTBlockMixin, BFTParams, LayerRun, fp32, record, register_variant
from bftrec.layers.precision import (
    gated_output_precision,
    gather_head_rows,
    gather_rows,
    geometric_mean_d,
    kalman_precision,
    kish_n,
    log_mean_precision,
    predict_precision,
    relative_reliability,
    sandwich_stats,
    sandwich_variance,
    scatter_rows,
    valid_rows,
)
from bftrec.models.hstu import HSTUBlock

__all__ = ["BFTHSTUBlock"]


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
                time_bucket: Optional[torch.Tensor] = None, **ctx) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """One filtering cycle; same contract as ``BFTSASRecBlock.forward`` (plus HSTU's ``time_bucket``
        (B, T, T) int64).

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
        record(run.probe, "lam", lam)

        # ---- observe: relative reliability and the sandwich estimator (BFT.md §4)
        u, q, k, v = self.attn.project(self.ln1(h))  # u (B, T, D); q, k, v (B, H, T, d)
        w = self.attn.weights(q, k, masks, time_bucket)  # (B, H, T, T), 0 where masked
        with fp32(dev):
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
        with fp32(dev):
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
        record(run.probe, "lam_obs", lam_obs)
        o = self.f2(self.drop(self.ln2(m) * u))  # (B, T, D): the native output, dropout included

        # ---- update: residual as a Kalman update (BFT.md §2); padding: K = 0, h' = h
        with fp32(dev):
            K, lam1 = kalman_precision(lam, lam_obs, hi, not learned)  # (n, D) or (1, 1); (n, D)
            delta = K * gather_rows(o, rows)  # (n, D)
        h1 = h.reshape(B * T, D).index_add(0, rows, delta.to(h.dtype)).view(B, T, D)
        record(run.probe, "lam1", lam1)

        # ---- predict: process noise only (BFT.md §3, HSTU has no FFN)
        lam2 = None
        if run.need_lam:
            with fp32(dev):
                lam2 = predict_precision(lam1, None, self.process_noise(), lo, hi)  # (n, D)
            record(run.probe, "lam2", lam2)
        if run.want_stats:
            stats.update({"K": K.detach().expand_as(lam1).mean(-1), "lam_obs": geometric_mean_d(lam_obs.detach()),
                          "n_eff": kish_n(a2, ok).detach()})
        return h1, lam2, stats
