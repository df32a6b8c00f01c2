"""Bias-corrected SGD converges to the raw data's least-squares solution as T grows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpcore.learning import Correction, bias_corrected_sgd
from dpcore.mechanisms.dpmix import generate as dpmix
from dpcore.mechanisms.dpmix.learning import correction as dpmix_correction
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm import generate as sgdrm
from dpcore.mechanisms.sgdrm.learning import correction as sgdrm_correction

N, D, K, SIGMA = 2000, 5, 2, 0.05


@pytest.fixture(scope="module")
def problem() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (N, D))
    # An offset the model has no intercept for: the mixing's mean term then matters.
    Y = X @ rng.normal(size=(K, D)).T + 3.0 + 0.05 * rng.normal(size=(N, K))
    w_star = np.linalg.lstsq(X, Y, rcond=None)[0].T
    return X, Y, w_star


def _release(kind: str, X: np.ndarray, Y: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    gen = SecureRandom.from_seed(T)
    if kind == "dpmix":
        chunks = dpmix.generate(
            torch.tensor(X),
            torch.tensor(Y),
            mixture_degree=4,
            n_samples=T,
            sigma_x=SIGMA,
            sigma_y=SIGMA,
            generator=gen,
        )
    else:
        chunks = sgdrm.generate(
            torch.tensor(X),
            torch.tensor(Y),
            mixture_width=16,
            n_samples=T,
            coefficient_bound=0.75,
            sigma=SIGMA,
            generator=gen,
        )
    xs, ys = zip(*chunks, strict=True)
    return torch.cat(xs).numpy(), torch.cat(ys).numpy()


def _correction(kind: str) -> Correction:
    if kind == "dpmix":
        return dpmix_correction(n=N, mixture_degree=4, sigma_x=SIGMA)
    return sgdrm_correction(n=N, mixture_width=16, sigma=SIGMA, coefficient_bound=0.75)


@pytest.mark.parametrize("kind", ["dpmix", pytest.param("sgdrm", marks=pytest.mark.slow)])
def test_converges_to_least_squares_as_T_grows(kind: str, problem: tuple) -> None:  # type: ignore[type-arg]
    X, Y, w_star = problem
    errors = []
    for T in (2_000, 20_000, 100_000):
        Xr, Yr = _release(kind, X, Y, T)
        W = bias_corrected_sgd(Xr, Yr, _correction(kind), epochs=5)
        errors.append(np.linalg.norm(W - w_star) / np.linalg.norm(w_star))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.02


def test_dpmix_without_the_mean_term_stays_biased(problem: tuple) -> None:  # type: ignore[type-arg]
    # The paper's Theorem 5 correction alone (scale and σ² only) misses the mixing's mean term.
    X, Y, w_star = problem
    Xr, Yr = _release("dpmix", X, Y, 100_000)
    full = _correction("dpmix")
    paper = Correction(scale=full.scale, noise_var=full.noise_var)
    good = bias_corrected_sgd(Xr, Yr, full, epochs=5)
    biased = bias_corrected_sgd(Xr, Yr, paper, epochs=5)
    assert np.linalg.norm(good - w_star) < 0.3 * np.linalg.norm(biased - w_star)


def test_sgdrm_clipping_correction_matches_monte_carlo() -> None:
    rng = np.random.default_rng(1)
    ell, c = 16, 0.3
    g = np.clip(rng.normal(0, 1 / np.sqrt(ell), 2_000_000), -c, c)
    corr = sgdrm_correction(n=1000, mixture_width=ell, sigma=0.0, coefficient_bound=c)
    # scale = n·E[b·clip(g)²] = ℓ·E[clip(g)²]
    assert corr.scale == pytest.approx(ell * np.mean(g**2), rel=3e-3)
    unclipped = sgdrm_correction(n=1000, mixture_width=ell, sigma=0.0, coefficient_bound=None)
    assert unclipped.scale == pytest.approx(1.0)


def test_input_validation() -> None:
    with pytest.raises(ValueError):
        bias_corrected_sgd(np.zeros((3, 2)), np.zeros((4, 1)), Correction(1.0, 0.0))
    with pytest.raises(ValueError):
        dpmix_correction(n=10, mixture_degree=11, sigma_x=1.0)
