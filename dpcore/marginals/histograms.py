"""Noisy histograms: counts plus Gaussian noise from the release's sampler."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from dpcore.mechanisms.noise import NoiseSampler


def noisy_counts(
    counts: np.ndarray, sigma: float, sampler: NoiseSampler, sensitivity: float
) -> np.ndarray:
    """Histograms (one per row of ``counts``) plus N(0, σ²) per cell; ``sensitivity`` is the
    L2 change of one row when one record is replaced (the caller's accountant's)."""
    values = torch.as_tensor(np.atleast_2d(counts), dtype=torch.float64)
    noised = sampler(values, sigma=sigma, sensitivity=sensitivity)
    return noised.double().numpy().reshape(np.shape(counts))


def counts(codes: np.ndarray, clique: tuple[int, ...], sizes: list[int]) -> np.ndarray:
    """The records' histogram over ``clique`` (axes in the clique's order)."""
    shape = [sizes[a] for a in clique]
    cells = np.ravel_multi_index(tuple(codes[:, a] for a in clique), shape)
    return np.bincount(cells, minlength=int(np.prod(shape))).reshape(shape)
