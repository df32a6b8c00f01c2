"""Releasing every record once, noised, in chunks (shared by per-record mechanisms).

Rows come out in the records' order; the label sensitivity is the one-hot √2 of
``dpcore.accounting.per_record``."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dpcore.accounting.per_record import LABEL_SENSITIVITY
from dpcore.mechanisms import float_error
from dpcore.mechanisms.noise import NoiseSampler

Chunks = Iterator[tuple[torch.Tensor, torch.Tensor]]
CHUNK_ROWS = 4096


def perturbed(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sigma_x: float,
    sigma_y: float,
    feature_sensitivity: float,
    noise: NoiseSampler,
    feature_error: float | None = None,
    dtype: torch.dtype | None = None,
) -> Chunks:
    """``feature_error``: the rows' floating-point error bound (default: rows released as
    stored, ``float_error.stored_rows``); one-hot labels are exact. Output in ``dtype``
    (default: the features')."""
    if feature_error is None:
        feature_error = float_error.stored_rows(feature_sensitivity)
    out = dtype or features.dtype
    for start in range(0, features.shape[0], CHUNK_ROWS):
        x = features[start : start + CHUNK_ROWS]
        y = labels[start : start + CHUNK_ROWS]
        yield (
            noise(x, sigma=sigma_x, sensitivity=feature_sensitivity, error=feature_error).to(out),
            noise(y, sigma=sigma_y, sensitivity=LABEL_SENSITIVITY).to(out),
        )
