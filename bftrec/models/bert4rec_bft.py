"""BFT twin of the post-LN ``BERT4RecBlock`` (``docs/BFT.md`` §1, §2 post-LN rule, §3 post-LN Jacobian, §7).

Registered for ``layer=bft`` / ``layer=bft_h`` when this module is imported (``bftrec/models/__init__.py``).
Labels follow BFT.md: **[paper]** = stated by the paper's summary, **[bftrec]** = our completion.
Kriging attention with the bidirectional (padding) mask and REML precision (``BFTBlockMixin.kriging_observe``,
the same observe step as SASRec's twin), Kalman update inside LN1 with the §2 post-LN rule, predict with
the post-LN Jacobian (§3, no LayerNorm term) and Q, then LN2 by the §2 rule. It keeps the native
parameter names (it subclasses the native block); ``bft.precision=uniform`` gives back the native block
exactly on valid positions (BFT.md §5.1).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from bftrec.layers import Masks
from bftrec.layers.bft import BFTBlockMixin, BFTParams, LayerRun, fp32, record, register_variant
from bftrec.layers.precision import (
    ffn_jacobian_diag,
    gather_rows,
    geometric_mean_d,
    kalman_precision,
    kish_n,
    layernorm_precision,
    predict_precision,
    valid_rows,
)
from bftrec.models.bert4rec import BERT4RecBlock

__all__ = ["BFTBERT4RecBlock"]


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
        record(run.probe, "lam", lam)

        # ---- observe: kriging attention, bidirectional padding mask (BFT.md §1); post-LN reads h itself
        o, lam_obs, ok, a2 = self.kriging_observe(h, lam, masks, run, rows, stats)

        # ---- update: Kalman update inside LN1, then the post-LN rule (BFT.md §2)
        with fp32(dev):
            K, lam_sum = kalman_precision(lam, lam_obs, hi, not learned)  # (n, D) or (1, 1); (n, D)
            delta = K * gather_rows(self.drop(o), rows)  # (n, D) = K ⊙ drop(o)
        x1 = h.reshape(B * T, D).index_add(0, rows, delta.to(h.dtype)).view(B, T, D)  # padding: K = 0
        del o, delta
        h1 = self.ln1(x1)  # (B, T, D)
        record(run.probe, "lam1_sum", lam_sum)
        with fp32(dev):
            x1_r, g1 = gather_rows(x1, rows).float(), self.ln1.weight.float()  # (n, D), (D,)
            if detach:
                x1_r, g1 = x1_r.detach(), g1.detach()
            lam1 = layernorm_precision(lam_sum, x1_r, g1, self.ln1.eps, lo, hi)  # (n, D)
        record(run.probe, "lam1", lam1)

        # ---- predict: FFN dynamics with process noise, then LN2 (BFT.md §3 post-LN, §2 rule)
        z = self.ffn.w1(h1)  # (B, T, F)
        x2 = h1 + self.drop(self.ffn.w2(self.ffn.act(z)))  # (B, T, D)
        h2 = self.ln2(x2)
        lam2 = None
        if run.need_lam:
            with fp32(dev):
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
                record(run.probe, "lam2_pred", lam_pred)
                lam2 = layernorm_precision(lam_pred, x2_r, g2, self.ln2.eps, lo, hi)  # (n, D)
            record(run.probe, "lam2", lam2)
        if run.want_stats:
            stats.update({"K": K.detach().expand_as(lam1).mean(-1), "lam_obs": geometric_mean_d(lam_obs.detach()),
                          "n_eff": kish_n(a2, ok).detach()})
        return h2, lam2, stats
