"""BFT twin of the pre-LN ``SASRecBlock`` (``docs/BFT.md`` §1–§3, §7).

Registered for ``layer=bft`` / ``layer=bft_h`` when this module is imported (``bftrec/models/__init__.py``).
Labels follow BFT.md: **[paper]** = stated by the paper's summary, **[bftrec]** = our completion. The
shared pieces come from ``bftrec.layers.bft`` (``BFTBlockMixin``: θ_Q, the s₀² buffers and the softmax
kriging observe step) and the formulas from ``bftrec.layers.precision``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from bftrec.layers import Masks
from bftrec.layers.bft import BFTBlockMixin, BFTParams, LayerRun, fp32, record, register_variant
from bftrec.layers.precision import (
    gather_rows,
    geometric_mean_d,
    kalman_precision,
    kish_n,
    predict_precision,
    prenorm_ffn_jacobian_diag_fused,
    valid_rows,
)
from bftrec.models.sasrec import SASRecBlock

__all__ = ["BFTSASRecBlock"]


@register_variant(SASRecBlock)
class BFTSASRecBlock(BFTBlockMixin, SASRecBlock):
    """BFT twin of the pre-LN ``SASRecBlock``: one filtering cycle observe → update → predict (BFT.md §1–§3).

    Same parameters as the native block (``ln1``, ``attn.qkv``, ``attn.out``, ``ln2``, ``ffn.w1``,
    ``ffn.w2``) plus ``theta_q`` and the ``s0sq`` buffers. Forward::

        x = LN1(h); q, k, v = heads(x)
        α̃ = masked_softmax(q kᵀ/√d + log λ̄_key)                     # kriging weights [paper]
        m, S = α̃ @ [v, v⊙v] (expanded square); n from Σα̃², Σα̃(1−α̃)  # [paper; form bftrec]
        Var(m) = σ²/n, σ² = (ν₀s₀² + nS)/(ν₀ + n − 1)                # REML + inv-χ² [paper; form bftrec]
        λ^obs = 1 / ((W_O⊙W_O) Var(m))                               # delta method [paper] (units=h)
        λ̂^obs = ((W_O⊙W_O) s₀²) / ((W_O⊙W_O) Var(m))                # units=count: in observations (§7)
        K = λ^obs/(λ + λ^obs); h' = h + K⊙drop(W_O drop(α̃) v); λ' = λ + λ^obs   # [paper]
        h'' = h' + drop(FFN(LN2 h')); λ'' = ((1+J)²/λ' + Q)⁻¹         # [paper]; J exact [bftrec]

    ``bft.precision=uniform``: zero attention bias and K = 1 on valid positions (λ is still computed),
    so the block equals the native one (BFT.md §5.1).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float, *,
                 bft_cfg: BFTParams) -> None:
        super().__init__(d_model, n_heads, d_ff, dropout, attn_dropout)
        if not isinstance(self.ffn.act, nn.GELU):
            raise TypeError("BFTSASRecBlock's Jacobian needs a GELU FFN")
        self.init_bft(d_model, n_heads, bft_cfg)

    def forward(self, h: torch.Tensor, lam: torch.Tensor, masks: Masks, run: Optional[LayerRun] = None,
                **ctx) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """One filtering cycle.

        Args:
            h: (B, T, D) float hidden state (float32 residual stream, also under autocast).
            lam: (n, D) float32 precision rows of the valid positions ``run.rows`` (``bftrec.layers.precision``
                "rows"; padding has no precision).
            masks: ``Masks`` (attn (B, 1, T, T) bool, valid (B, T) bool; True = may attend / real).
            run: ``LayerRun`` flags from the stack; ``run.rows`` None = computed from ``masks.valid``.
        Returns:
            h'' (B, T, D); λ'' (n, D) float32 rows or None when ``run.need_lam`` is False; stats dict with
            ``prior`` ((H, d) total, (H,) count) in training, and ``K`` (n,) float32 row means over D,
            ``lam_obs`` (n,) float32 row geometric means over D (λ̄, BFT.md §6) and ``n_eff`` (B, T) float32
            when ``run.want_stats``.
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
        record(run.probe, "lam", lam)

        # ---- observe: kriging attention (BFT.md §1)
        o, lam_obs, ok, a2 = self.kriging_observe(self.ln1(h), lam, masks, run, rows, stats)  # pre-LN

        # ---- update: residual as a Kalman update (BFT.md §2); padding: K = 0, h' = h
        with fp32(dev):
            K, lam1 = kalman_precision(lam, lam_obs, hi, not learned)  # (n, D) or (1, 1); (n, D)
            delta = K * gather_rows(self.drop(o), rows)  # (n, D) = K ⊙ drop(o); dropout position-aligned as native
        h1 = h.reshape(B * T, D).index_add(0, rows, delta.to(h.dtype)).view(B, T, D)  # (B·T, D) -> (B, T, D)
        del o, delta
        record(run.probe, "lam1", lam1)

        # ---- predict: FFN as dynamics with process noise (BFT.md §3)
        z = self.ffn.w1(self.ln2(h1))  # (B, T, F)
        h2 = h1 + self.drop(self.ffn.w2(self.ffn.act(z)))
        lam2 = None
        if run.need_lam:
            with fp32(dev):
                ln, f1, f2 = self.ln2, self.ffn.w1, self.ffn.w2
                prm = [ln.weight, ln.bias, f1.weight, f1.bias, f2.weight]
                prm = [p.detach().float() if detach else p.float() for p in prm]
                x32 = h1.detach().float() if detach else h1.float()
                J = prenorm_ffn_jacobian_diag_fused(x32, prm[0], prm[1], ln.eps, prm[2], prm[3], prm[4],
                                                    self.ffn.act.approximate, rows=rows)  # (n, D), z recomputed
                lam2 = predict_precision(lam1, J, self.process_noise(), lo, hi)  # (n, D)
            record(run.probe, "lam2", lam2)
        if run.want_stats:
            stats.update({"K": K.detach().expand_as(lam1).mean(-1), "lam_obs": geometric_mean_d(lam_obs.detach()),
                          "n_eff": kish_n(a2, ok).detach()})
        return h2, lam2, stats
