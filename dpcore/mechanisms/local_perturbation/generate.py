"""Local perturbation (Lee et al., ISIT 2019, Section IV): every record released once, noised.

Inputs are unit-scale (features in [0, 1] with L2 norm ≤ 1, one-hot labels), which is what the
accountant assumes. Rows come out in the records' order.
"""

from __future__ import annotations

import torch

from dpcore.accounting.per_record import FEATURE_SENSITIVITY
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.rows import Chunks, perturbed
from dpcore.mechanisms.secure_random import SecureRandom


def local_perturbation(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sigma_x: float,
    sigma_y: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
) -> Chunks:
    """(x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i, in chunks.

    ``noise`` draws the noise (default: the fast sampler on ``generator``)."""
    return perturbed(
        features,
        labels,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        feature_sensitivity=FEATURE_SENSITIVITY,
        noise=noise if noise is not None else FastNoise(generator),
    )
