"""Update (docs/BFT.md §2): the Kalman gain K, the posterior precision and the residual update.

Conventions (shapes, rows, clamps, dtypes): ``bftrec.layers.precision``.
"""
from __future__ import annotations

import torch

from bftrec.layers.precision.compile import compilable


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


@compilable
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
