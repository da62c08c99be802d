"""Pure precision math of the BFT layer (``docs/BFT.md``, cited below as BFT.md), one module per filtering step:
``observe`` (§1, kriging), ``sandwich`` (§4, pointwise attention), ``update`` (§2, Kalman), ``predict`` (§3,
dynamics), on the compact ``rows`` layout.

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

from bftrec.layers.precision.compile import compilable, compiling
from bftrec.layers.precision.observe import *  # noqa: F403
from bftrec.layers.precision.observe import (
    geometric_mean_d,
    kish_b,
    kish_n,
    kish_sums,
    kriging_attention,
    kriging_bias,
    kriging_moments,
    kriging_stats,
    log_mean_precision,
    observe_from_stats,
    observe_precision,
    output_precision,
    prior_statistic,
    reml_shrinkage,
)
from bftrec.layers.precision.predict import *  # noqa: F403
from bftrec.layers.precision.predict import (
    ffn_jacobian_diag,
    gelu_prime,
    layernorm_precision,
    predict_precision,
    prenorm_ffn_jacobian_diag,
    prenorm_ffn_jacobian_diag_fused,
)
from bftrec.layers.precision.rows import (
    gather_head_rows,
    gather_rows,
    scatter_rows,
    valid_rows,
)
from bftrec.layers.precision.sandwich import (
    gated_output_precision,
    relative_reliability,
    sandwich_stats,
    sandwich_variance,
)
from bftrec.layers.precision.update import (
    kalman_gain,
    kalman_precision,
    kalman_update,
)

__all__ = [
    "valid_rows", "gather_rows", "scatter_rows", "gather_head_rows",
    "log_mean_precision", "geometric_mean_d", "kriging_bias", "kriging_moments", "kish_b", "kish_sums",
    "kriging_stats", "reml_shrinkage",
    "prior_statistic", "output_precision", "observe_precision", "kriging_attention", "observe_from_stats", "kish_n",
    "relative_reliability", "sandwich_stats", "sandwich_variance", "gated_output_precision",
    "kalman_gain", "kalman_precision", "kalman_update",
    "gelu_prime", "ffn_jacobian_diag", "prenorm_ffn_jacobian_diag", "prenorm_ffn_jacobian_diag_fused",
    "predict_precision", "layernorm_precision", "compilable", "compiling",
]
