"""Random projection (Lee et al., ISIT 2019, Section IV): every record projected by a
data-independent Gaussian matrix, then noised.

Inputs are unit-scale (features in [0, 1] with L2 norm ≤ 1, one-hot labels), which is what the
accountant assumes. Rows come out in the records' order.
"""

from __future__ import annotations

import torch

from dpcore.accounting.per_record import FEATURE_SENSITIVITY
from dpcore.mechanisms import float_error
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.rows import Chunks, perturbed
from dpcore.mechanisms.secure_random import SecureRandom

# The spectral norm is computed (SVD in float64), not exact: the sensitivity is raised by this
# relative margin, far above the SVD's backward error (a small multiple of d·2⁻⁵³·‖R‖).
SPECTRAL_MARGIN = 1e-9


def projection_matrix(
    projection_dim: int, n_features: int, spectral_norm: float, *, generator: SecureRandom
) -> torch.Tensor:
    """A Gaussian (projection_dim × n_features) float64 matrix rescaled to spectral norm s
    (up to ``SPECTRAL_MARGIN``): the accountant's feature sensitivity is then √2·s. It never
    looks at the data."""
    matrix = generator.normal((projection_dim, n_features))
    return matrix * (spectral_norm / torch.linalg.matrix_norm(matrix, ord=2))


def random_projection(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    projection_dim: int,
    spectral_norm: float,
    sigma_x: float,
    sigma_y: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
) -> tuple[torch.Tensor, Chunks]:
    """(R x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i, and R (public)."""
    matrix = projection_matrix(
        projection_dim, features.shape[1], spectral_norm, generator=generator
    ).to(features.device)
    # Kept in float64 for the sampler: each row of R·x is a sum of d products, |R|·|x| has
    # norm ≤ ‖R‖_F·‖x‖ ≤ √k·s·‖x‖, and the computed spectral norm is off by SPECTRAL_MARGIN.
    projected = features.double() @ matrix.T
    sensitivity = FEATURE_SENSITIVITY * spectral_norm
    error = sensitivity * SPECTRAL_MARGIN + float_error.scaled_sum(
        sensitivity * (1 + SPECTRAL_MARGIN),
        terms=features.shape[1],
        magnitude=projection_dim**0.5 * spectral_norm * (1 + SPECTRAL_MARGIN),
    )
    chunks = perturbed(
        projected,
        labels,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        feature_sensitivity=sensitivity,
        noise=noise if noise is not None else FastNoise(generator),
        feature_error=error,
        dtype=features.dtype,
    )
    return matrix, chunks
