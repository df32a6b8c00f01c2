"""Squared distances between rows, shared by ClustMix's variants (``paper``'s clustering and
kernels, ``dpkip``'s rbf kernel)."""

from __future__ import annotations

import torch


def square_distances(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """‖x_i − c_k‖² (m, n), never negative."""
    sq = (X * X).sum(dim=1)[:, None] + (C * C).sum(dim=1)[None, :] - 2.0 * (X @ C.T)
    return sq.clamp_min(0.0)
