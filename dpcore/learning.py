"""Learning a linear model from a release: bias-corrected SGD for least squares.

For a release of noisy mixtures (x′, y′) the plain least-squares gradient g = (W x′ − y′)x′ᵀ is
biased: the noise adds σ_x² W, and the mixing rescales and mixes the data's second moments.
A mechanism that supports this gives its ``Correction`` (in its folder's ``learning`` module),
computed from public parameters and the release itself (post-processing, no privacy cost);
with it E[V] is the gradient of J(W) = ‖WX − Y‖²_F/(2n), so SGD with decreasing steps and
iterate averaging converges to the least-squares solution of the raw data as T grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Correction:
    """E[g] = scale·∇J(W) + σ²W + mean_weight·(Wμ − μ_y)μᵀ."""

    scale: float
    noise_var: float
    mean_weight: float = 0.0


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
