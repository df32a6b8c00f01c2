"""The two baselines of DPMix's Section IV: every record released once, noisy.

Inputs are preprocessed as for DPMix (features in [0, 1] with L2 norm ≤ 1, one-hot labels),
which is what `dpcore.accounting.baselines` assumes. Rows come out in the records' order.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dpcore.accounting.baselines import FEATURE_SENSITIVITY, LABEL_SENSITIVITY
from dpcore.mechanisms.noise import FastNoise, NoiseSampler

Chunks = Iterator[tuple[torch.Tensor, torch.Tensor]]
_CHUNK_ROWS = 4096


def local_perturbation(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sigma_x: float,
    sigma_y: float,
    generator: torch.Generator,
    noise: NoiseSampler | None = None,
) -> Chunks:
    """(x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i, in chunks.

    ``noise`` draws the noise (default: the fast sampler on ``generator``)."""
    return _perturbed(
        features,
        labels,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        feature_sensitivity=FEATURE_SENSITIVITY,
        noise=noise if noise is not None else FastNoise(generator),
    )


def _perturbed(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sigma_x: float,
    sigma_y: float,
    feature_sensitivity: float,
    noise: NoiseSampler,
) -> Chunks:
    for start in range(0, features.shape[0], _CHUNK_ROWS):
        x = features[start : start + _CHUNK_ROWS]
        y = labels[start : start + _CHUNK_ROWS]
        yield (
            noise(x, sigma=sigma_x, sensitivity=feature_sensitivity),
            noise(y, sigma=sigma_y, sensitivity=LABEL_SENSITIVITY),
        )


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
    chunks = _perturbed(
        projected,
        labels,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        feature_sensitivity=FEATURE_SENSITIVITY * spectral_norm,
        noise=noise if noise is not None else FastNoise(generator),
    )
    return matrix, chunks
