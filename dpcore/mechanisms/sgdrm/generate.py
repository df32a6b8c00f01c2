"""SGDRM mixtures (Lee et al., ICLR 2018 workshop).

Mixture t is Σ_i c_{t,i}(x_i, y_i) + noise with c_{t,i} = b_{t,i}·clip(g_{t,i}, −c, c),
b ~ Bern(ℓ/n) and g ~ N(0, 1/ℓ), all independent: exactly the Poisson inclusion and the
coefficient bound the `sgdrm/tight` accountant assumes. Inclusion is [V < ℓ/n] for V uniform
on [0, 1) read lazily from the secure source's bytes (``sampling.lazy_bernoulli``: about one
byte per entry, exactly Bernoulli(ℓ/n)); g is drawn only where b = 1, in row-major order
(elsewhere it would be multiplied by 0, so the coefficients' law is the same). With
``clip=False`` (the paper's coefficients) g is not clipped; c then only tells the noise
sampler the contribution radius the coupling analysis starts from (its analysis bound is
never smaller). A mixture is the sparse product Σ_{i: b=1} c_{t,i}(x_i, y_i), computed as a
weighted ``embedding_bag`` over the included records in float64 (≈ ℓ rows read per mixture,
not a dense count × n matrix); the sampler's error covers n terms of coefficient ≤ c
(docs/privacy.md, "Rounding of the noised rows").
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.sampling import lazy_bernoulli
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm.accounting import RECORD_NORM

_MATRIX_BUDGET = 1 << 25  # inclusion bytes per chunk


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    mixture_width: int,
    n_samples: int,
    coefficient_bound: float,
    sigma: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    clip: bool = True,
    basis: Basis | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """With a ``basis`` the features are projected (a contraction: a record's contribution
    keeps its radius, plus the projection's rounding) and the noisy rows mapped back."""
    sampler = noise if noise is not None else FastNoise(generator)
    # One Gaussian on the joint (x, y) row: one record's contribution has norm ≤ c·√2.
    radius = coefficient_bound * RECORD_NORM
    n = features.shape[0]
    if labels.shape[0] != n:
        raise ValueError("features and labels disagree on the number of records")
    if not 1 <= mixture_width <= n:
        raise ValueError(f"mixture_width must be between 1 and n={n}")
    scale = 1.0 / math.sqrt(mixture_width)
    device, dtype = features.device, features.dtype
    error = float_error.scaled_sum(radius, terms=n, magnitude=n * radius)
    if basis is not None:
        # Per record: its projected features (norm ≤ 1 as stored) times a coefficient ≤ c.
        error += basis.excess(radius, coefficient_bound * (1.0 + float_error.INPUT_RELATIVE))
        features = basis.project(features)
    width = features.shape[1]
    records = torch.cat((features.double(), labels.double()), dim=1)
    step = max(1, min(4096, _MATRIX_BUDGET // n))
    for start in range(0, n_samples, step):
        count = min(step, n_samples - start)
        included = lazy_bernoulli(mixture_width, n, (count, n), generator=generator)
        rows, members = np.nonzero(included)  # row-major: each row's members in order
        g = generator.normal((members.size,), device=device) * scale
        if clip:
            g = g.clamp(-coefficient_bound, coefficient_bound)
        offsets = np.zeros(count, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=count)[:-1], out=offsets[1:])
        mixed = torch.nn.functional.embedding_bag(
            torch.from_numpy(members).to(device),
            records,
            torch.from_numpy(offsets).to(device),
            mode="sum",
            per_sample_weights=g,
        )
        noisy = sampler(mixed, sigma=sigma, sensitivity=radius, error=error)
        x, y = noisy[:, :width], noisy[:, width:]
        yield (basis.lift(x, dtype) if basis is not None else x.to(dtype)), y.to(dtype)
