"""Rows: the compact layout of per-token precision quantities (valid positions only; see the package docstring).

Conventions (shapes, rows, clamps, dtypes): ``bftrec.layers.precision``.
"""
from __future__ import annotations

import torch


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
