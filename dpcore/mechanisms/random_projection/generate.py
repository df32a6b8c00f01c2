"""Random projection (Lee et al., ISIT 2019, Section IV): every record projected by a
data-independent Gaussian matrix, then noised.

Inputs are unit-scale (features in [0, 1] with L2 norm ≤ 1, one-hot labels), which is what the
accountant assumes. Rows come out in the records' order.
"""

from __future__ import annotations

import torch

from dpcore.accounting.per_record import FEATURE_SENSITIVITY
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.rows import Chunks, perturbed


def projection_matrix(
    projection_dim: int, n_features: int, spectral_norm: float, *, generator: torch.Generator
) -> torch.Tensor:
    """A Gaussian (projection_dim × n_features) float64 matrix rescaled to spectral norm s
    exactly: the accountant's feature sensitivity is then √2·s. It never looks at the data."""
    matrix = torch.randn(
        (projection_dim, n_features),
        generator=generator,
        device=generator.device,
        dtype=torch.float64,
    )
    return matrix * (spectral_norm / torch.linalg.matrix_norm(matrix, ord=2))


def random_projection(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    projection_dim: int,
    spectral_norm: float,
    sigma_x: float,
    sigma_y: float,
    generator: torch.Generator,
    noise: NoiseSampler | None = None,
) -> tuple[torch.Tensor, Chunks]:
    """(R x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i, and R (public)."""
    matrix = projection_matrix(
        projection_dim, features.shape[1], spectral_norm, generator=generator
    ).to(features.device)
    projected = (features.double() @ matrix.T).to(features.dtype)
    chunks = perturbed(
        projected,
        labels,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        feature_sensitivity=FEATURE_SENSITIVITY * spectral_norm,
        noise=noise if noise is not None else FastNoise(generator),
    )
    return matrix, chunks
