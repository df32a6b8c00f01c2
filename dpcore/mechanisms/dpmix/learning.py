"""Bias correction for least squares on a DPMix release (Lee et al. 2019, Thm 5).

A mixture averages ℓ distinct records, so with μ = mean(x), E[x′x′ᵀ] = a·S + b·μμᵀ + σ²I,
a = (n − ℓ)/(ℓ(n − 1)), b = (ℓ − 1)n/(ℓ(n − 1)), and likewise for y′x′ᵀ. The paper's
E[CCᵀ] = I/(nℓ) drops the b term, which is O(1) unless the data are centred; here it is removed
with μ and μ_y estimated by the release's own column means: V = (g − σ²W − b(Wμ̂ − μ̂_y)μ̂ᵀ)/a
(up to the plug-in error of μ̂, O(1/T)).
"""

from __future__ import annotations

from dpcore.learning import Correction


def correction(*, n: int, mixture_degree: int, sigma_x: float) -> Correction:
    ell = mixture_degree
    if not 1 <= ell <= n or n < 2:
        raise ValueError("need 1 <= mixture_degree <= n and n >= 2")
    return Correction(
        scale=(n - ell) / (ell * (n - 1)),
        noise_var=sigma_x**2,
        mean_weight=(ell - 1) * n / (ell * (n - 1)),
    )
