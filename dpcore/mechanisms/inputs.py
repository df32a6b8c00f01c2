"""Tensors a generator starts from, made with public facts only."""

from __future__ import annotations

import torch

from dpcore.mechanisms.spec import PrivateData
from dpcore.preprocessing import one_hot, unit_features


def unit_scale(data: PrivateData, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features in [0, 1] with L2 norm ≤ 1 (declared bounds) and one-hot labels over the
    declared classes: what the unit-scale accountants' sensitivities assume."""
    features = unit_features(data.X, data.lo, data.hi)
    labels = one_hot(data.labels, len(data.classes))
    return (
        torch.as_tensor(features, dtype=torch.float32, device=device),
        torch.as_tensor(labels, dtype=torch.float32, device=device),
    )
