"""SGDRM's sampler is exactly what its accountant assumes: Bernoulli inclusion, clipped
Gaussian coefficients, independent across mixtures."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm.generate import generate


def _coefficients(n: int, ell: int, T: int, c: float, seed: int = 0) -> np.ndarray:
    # Identity features expose each mixture's coefficient vector.
    chunks = generate(
        torch.eye(n, dtype=torch.float64),
        torch.zeros((n, 1), dtype=torch.float64),
        mixture_width=ell,
        n_samples=T,
        coefficient_bound=c,
        sigma=0.0,
        generator=SecureRandom.from_seed(seed),
    )
    return torch.cat([x for x, _ in chunks]).numpy()


def test_inclusion_is_bernoulli_and_coefficients_are_clipped_gaussians() -> None:
    n, ell, T, c = 50, 5, 4000, 0.3
    C = _coefficients(n, ell, T, c)
    included = C != 0
    q = ell / n
    # Inclusion count per mixture ~ Binomial(n, q): mean nq, variance nq(1 − q).
    counts = included.sum(axis=1)
    mean, var = n * q, n * q * (1 - q)
    assert abs(counts.mean() - mean) < 5 * math.sqrt(var / T)
    assert abs(counts.var() - var) < 0.1 * var
    # Every record is included at rate q.
    per_record = included.mean(axis=0)
    assert np.abs(per_record - q).max() < 5 * math.sqrt(q * (1 - q) / T)
    values = C[included]
    assert np.abs(values).max() <= c
    # Clipped N(0, 1/ℓ): compare the empirical CDF inside (−c, c) with the normal's.
    inside = values[np.abs(values) < c]
    ks = stats.kstest(
        inside,
        stats.truncnorm(-c * math.sqrt(ell), c * math.sqrt(ell), scale=1 / math.sqrt(ell)).cdf,
    )
    assert ks.pvalue > 1e-4
    expected_clip = 2 * stats.norm.sf(c * math.sqrt(ell))
    assert abs((np.abs(values) == c).mean() - expected_clip) < 0.02


def test_mixtures_are_independent() -> None:
    C = _coefficients(40, 8, 3000, 1.0, seed=3) != 0
    a, b = C[:-1].ravel().astype(float), C[1:].ravel().astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


def test_noise_scale() -> None:
    chunks = generate(
        torch.zeros((10, 3)),
        torch.zeros((10, 2)),
        mixture_width=2,
        n_samples=5000,
        coefficient_bound=1.0,
        sigma=2.5,
        generator=SecureRandom.from_seed(1),
    )
    X = torch.cat([x for x, _ in chunks]).numpy()
    assert abs(X.std() - 2.5) < 0.05
