"""Learning a linear model from a release: bias-corrected SGD for least squares.

For a release of noisy mixtures (x′, y′) the plain least-squares gradient g = (W x′ − y′)x′ᵀ is
biased: the noise adds σ_x² W, and the mixing rescales and mixes the data's second moments.
The corrections, all computable from public parameters and the release itself
(post-processing, no privacy cost):

- SGDRM (Lee et al. 2018, Thm 2): coefficients c_i independent with mean 0 and E[c_i²] = v, so
  E[x′x′ᵀ] = n·v·S + σ²I and E[y′x′ᵀ] = n·v·S_yx with S = XXᵀ/n: V = (g − σ²W)/(n·v). With the
  paper's N(0, 1/ℓ)·Bern(ℓ/n) coefficients n·v = 1; clipping at c lowers v (computed exactly).
- DPMix (Lee et al. 2019, Thm 5): a mixture averages ℓ distinct records, so with μ = mean(x),
  E[x′x′ᵀ] = a·S + b·μμᵀ + σ²I, a = (n − ℓ)/(ℓ(n − 1)), b = (ℓ − 1)n/(ℓ(n − 1)), and likewise
  for y′x′ᵀ. The paper's E[CCᵀ] = I/(nℓ) drops the b term, which is O(1) unless the data are
  centred; here it is removed with μ and μ_y estimated by the release's own column means:
  V = (g − σ²W − b(Wμ̂ − μ̂_y)μ̂ᵀ)/a.

Both make E[V] the gradient of J(W) = ‖WX − Y‖²_F/(2n) (up to the plug-in error of μ̂ for
DPMix, O(1/T)), so SGD with decreasing steps and iterate averaging converges to the
least-squares solution of the raw data as T grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Correction:
    """E[g] = scale·∇J(W) + σ²W + mean_weight·(Wμ − μ_y)μᵀ."""

    scale: float
    noise_var: float
    mean_weight: float = 0.0


def dpmix_correction(*, n: int, mixture_degree: int, sigma_x: float) -> Correction:
    ell = mixture_degree
    if not 1 <= ell <= n or n < 2:
        raise ValueError("need 1 <= mixture_degree <= n and n >= 2")
    return Correction(
        scale=(n - ell) / (ell * (n - 1)),
        noise_var=sigma_x**2,
        mean_weight=(ell - 1) * n / (ell * (n - 1)),
    )


def sgdrm_correction(
    *, n: int, mixture_width: int, sigma: float, coefficient_bound: float | None
) -> Correction:
    """n·E[c²] for c = b·clip(g, −c, c), b ~ Bern(ℓ/n), g ~ N(0, 1/ℓ)."""
    ell = mixture_width
    if coefficient_bound is None:
        second_moment = 1.0 / ell
    else:
        t = coefficient_bound * math.sqrt(ell)  # the clip in units of g's std
        inside = stats.norm.cdf(t) - stats.norm.cdf(-t) - 2 * t * stats.norm.pdf(t)
        second_moment = (inside + 2 * t * t * stats.norm.sf(t)) / ell
    return Correction(scale=n * (ell / n) * second_moment, noise_var=sigma**2)


def bias_corrected_sgd(
    X: np.ndarray,
    Y: np.ndarray,
    correction: Correction,
    *,
    epochs: int = 20,
    batch_size: int = 32,
    learning_rate: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Least squares W (n_outputs × n_features) from release rows X (T × d), Y (T × k).

    Steps α_t = learning_rate/√t on minibatch-averaged corrected gradients; the returned W is
    the average of the iterates of the last half (Polyak–Ruppert).
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError("X and Y must be 2-D with the same number of rows")
    rng = np.random.default_rng(seed)
    rows, dim = X.shape
    W = np.zeros((Y.shape[1], dim))
    mu, mu_y = X.mean(axis=0), Y.mean(axis=0)
    steps = epochs * math.ceil(rows / batch_size)
    averaged = np.zeros_like(W)
    counted = 0
    step = 0
    for _ in range(epochs):
        order = rng.permutation(rows)
        for start in range(0, rows, batch_size):
            batch = order[start : start + batch_size]
            xb, yb = X[batch], Y[batch]
            g = (xb @ W.T - yb).T @ xb / len(batch)
            g -= correction.noise_var * W
            if correction.mean_weight:
                g -= correction.mean_weight * np.outer(W @ mu - mu_y, mu)
            step += 1
            W -= learning_rate / math.sqrt(step) * g / correction.scale
            if step > steps // 2:
                averaged += W
                counted += 1
    return averaged / max(counted, 1)
