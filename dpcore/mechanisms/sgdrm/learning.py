"""Bias correction for least squares on an SGDRM release (Lee et al. 2018, Thm 2).

Coefficients c_i are independent with mean 0 and E[c_i²] = v, so E[x′x′ᵀ] = n·v·S + σ²I and
E[y′x′ᵀ] = n·v·S_yx with S = XXᵀ/n: V = (g − σ²W)/(n·v). With the paper's N(0, 1/ℓ)·Bern(ℓ/n)
coefficients n·v = 1; clipping at c lowers v (computed exactly).
"""

from __future__ import annotations

import math

from scipy import stats

from dpcore.learning import Correction


def correction(
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
