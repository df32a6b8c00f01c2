"""Tensors a generator starts from, made with public facts only."""

from __future__ import annotations

import numpy as np
import torch

from dpcore.mechanisms.contract import PrivateData
from dpcore.preprocessing import RowTransform, one_hot


def unit_transform(data: PrivateData, clip_norm: float, output: str = "raw") -> RowTransform:
    """Declared bounds to [0, 1], rows clipped to C and divided by C: rows of norm ≤ 1 with
    every value ≥ 0, what the unit-scale accountants' sensitivities assume."""
    return RowTransform.unit_range(data.lo, data.hi, clip_norm, output=output)


def unit_scale(
    data: PrivateData, device: torch.device, transform: RowTransform
) -> tuple[torch.Tensor, torch.Tensor]:
    """The records through ``transform`` (features) and one-hot labels over the declared
    classes."""
    features = transform.rows(data.X, np.float32)
    labels = one_hot(data.labels, len(data.classes))
    return (
        torch.as_tensor(features, dtype=torch.float32, device=device),
        torch.as_tensor(labels, dtype=torch.float32, device=device),
    )
