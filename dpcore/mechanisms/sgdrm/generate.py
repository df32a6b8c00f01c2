"""SGDRM mixtures (Lee et al., ICLR 2018 workshop).

Mixture t is Σ_i c_{t,i}(x_i, y_i) + noise with c_{t,i} = b_{t,i}·clip(g_{t,i}, −c, c),
b ~ Bern(ℓ/n) and g ~ N(0, 1/ℓ), all independent: exactly the Poisson inclusion and the
coefficient bound the `sgdrm/tight` accountant assumes.

Inclusion is drawn in O(ℓ) per mixture, not as n coins (``sampling.poisson_subsets``): a size
K ~ Binomial(n, ℓ/n), exact (``binomial``: inversion of a uniform V read as bits against
rigorous integer bounds on the CDF, answered only when certain), then a uniform K-subset
(``sampling.uniform_subsets``, exact). P(S = A) = P(K = |A|)/C(n, |A|) = q^|A|(1 − q)^(n−|A|)
for every set A: the law of n independent Bernoulli(q) bits b_{t,·}. g is drawn only where
b = 1, in row-major order, members increasing (elsewhere it would be multiplied by 0, so the
coefficients' law is the same). With ``clip=False`` (the paper's coefficients) g is not
clipped; c then only tells the noise sampler the contribution radius the coupling analysis
starts from (its analysis bound is never smaller).

A mixture is the sparse product Σ_{i: b=1} c_{t,i}(x_i, y_i) in float64: a compressed-row
count × n coefficient matrix times the records (≈ ℓ rows read per mixture, no dense count × n
matrix); the sampler's error covers n terms of coefficient ≤ c in any order of summation
(docs/privacy.md, "Rounding of the noised rows").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.sampling import chunk_size, poisson_subsets
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm.accounting import RECORD_NORM


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
    step = chunk_size(mixture_degree=mixture_width, dim=records.shape[1], n=n)
    for start in range(0, n_samples, step):
        count = min(step, n_samples - start)
        members, pointers = poisson_subsets(n, mixture_width, count, generator=generator)
        g = generator.normal((members.size,), device=device) * scale
        if clip:
            g = g.clamp(-coefficient_bound, coefficient_bound)
        mixed = _mixing_matrix(pointers, members, g, n) @ records
        noisy = sampler(mixed, sigma=sigma, sensitivity=radius, error=error)
        x, y = noisy[:, :width], noisy[:, width:]
        yield (basis.lift(x, dtype) if basis is not None else x.to(dtype)), y.to(dtype)


def _mixing_matrix(
    pointers: np.ndarray, members: np.ndarray, coefficients: torch.Tensor, n: int
) -> torch.Tensor:
    """The chunk's count × n coefficients as a compressed-row sparse float64 matrix on the
    coefficients' device: its product with the records reads each included record once,
    multithreaded (float64 ``embedding_bag`` runs on one thread and measured several times
    slower; docs/results/implementation.md). Rows' members are increasing, as the format
    requires (checked)."""
    device = coefficients.device
    with warnings.catch_warnings():
        # torch marks its compressed sparse rows as a beta API; the product is what is used.
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(pointers).to(device),
            torch.from_numpy(members).to(device),
            coefficients,
            size=(pointers.size - 1, n),
            check_invariants=True,
        )
