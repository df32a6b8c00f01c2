"""Released values matched to a noisy histogram of the private values (pooled over features).

Rows sampled from a smooth model (a Gaussian in a low-frequency basis) carry the right shapes
but the wrong values: on MNIST about 37 % of sampled pixels sit at 0 where the digits have 81 %,
and strokes come out grey. One more noisy statistic fixes the values' distribution: every
record's histogram of its feature values in [0, 1] (``BINS`` levels: value v counts in level
round(v·(BINS − 1))), divided by d so that each record weighs 1, summed over the records,
plus N(0, σ²) per level.

Sensitivity (replace-one, n public): a record's contribution p is a probability vector, so
‖p‖₂ ≤ ‖p‖₁ = 1 and p·p′ ≥ 0, and ‖p − p′‖₂² = ‖p‖² + ‖p′‖² − 2p·p′ ≤ 2: ``SENSITIVITY`` = √2,
attained by two records whose values all sit in one level each, different levels. Whatever
the records' classes or clusters: the histogram is one vector.

Post-processing (``ValueMap``): F̂, the running sum of the noisy levels over n (public: each
record weighs 1), made non-decreasing by isotonic regression and clipped to [0, 1] — summing
first averages the per-level noise that clamping each level at 0 would turn into mass; F_s, the
distribution of the sampled values, from a reference draw of the model (no data read). Each
sampled value v becomes the level F̂⁻¹(F_s(v)) (ties share their mid rank), blended with v:
(1 − w)·v + w·F̂⁻¹(F_s(v)). Monotone in v, within [0, 1]. ``automatic_blend`` picks w from
the fit's shrinkage weights when the request does not.

Only where every feature shares one range and meaning (image pixels): one pooled histogram.

Written by hand: the statistic is one histogram and the map a quantile transform; no
library releases either under a declared noise.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Levels of the pooled histogram: 256 grey levels (8-bit images map onto their own values).
BINS = 256
SENSITIVITY = math.sqrt(2.0)


def levels(X01: torch.Tensor) -> torch.Tensor:
    """Each value's level, round(v·(BINS − 1)), for values in [0, 1] (clamped)."""
    return torch.round(X01.double().clamp(0.0, 1.0) * (BINS - 1)).long()


def histogram(X01: torch.Tensor) -> torch.Tensor:
    """Σ over records of each record's value histogram divided by d: float64 (1, BINS)."""
    d = int(X01.shape[1])
    counts = torch.bincount(levels(X01).reshape(-1).cpu(), minlength=BINS)
    return (counts.double() / d)[None, :]


def rounding_error(n: int) -> float:
    """How far float rounding can move two neighbours' computed histograms apart beyond the
    sensitivity: the counts are exact integers (n·d < 2⁵³), each divided by d once, a relative
    error ≤ 2⁻⁵³ per level, over two histograms of total mass n."""
    return 2.0 * n * 2.0**-53


def automatic_blend(shrink_weights: list[float]) -> float:
    """The blend w when the request leaves it unset: clamp(2·(1 − mean λ), ½, 1) over the fitted
    covariances' shrinkage weights λ (post-processing of the noisy statistics). λ measures how
    much of a covariance is noise; mapped onto the data's levels, that noise becomes
    full-contrast speckle that nearest-neighbour models read, so the blend falls to ½ as λ
    rises past ¾ and is 1 once λ ≤ ½. No fitted covariance (nothing kept): ½."""
    if not shrink_weights:
        return 0.5
    mean = sum(shrink_weights) / len(shrink_weights)
    return min(1.0, max(0.5, 2.0 * (1.0 - mean)))


class ValueMap:
    """v ↦ (1 − w)·v + w·F̂⁻¹(F_s(v)) (module docstring). ``noisy`` the released histogram (BINS,)
    or (1, BINS), ``n`` the public record count, ``reference`` sampled values whose
    distribution is F_s (any shape), ``blend`` w ∈ [0, 1]."""

    def __init__(
        self, noisy: torch.Tensor, n: int, reference: torch.Tensor, blend: float = 1.0
    ) -> None:
        if not 0.0 <= blend <= 1.0:
            raise ValueError(f"blend must be in [0, 1], got {blend}")
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
        from sklearn.isotonic import isotonic_regression

        running = np.cumsum(noisy.double().reshape(-1).cpu().numpy()) / n
        cdf = np.clip(isotonic_regression(running), 0.0, 1.0)
        cdf[-1] = 1.0
        self.cdf = torch.as_tensor(cdf, dtype=torch.float64)
        self.reference = torch.sort(reference.double().reshape(-1).cpu()).values
        if self.reference.numel() == 0:
            raise ValueError("the reference draw is empty")
        self.blend = float(blend)

    def target(self, values: torch.Tensor) -> torch.Tensor:
        """F̂⁻¹(F_s(v)): the level at v's mid rank among the reference values, in [0, 1]."""
        flat = values.double().reshape(-1).cpu()
        below = torch.searchsorted(self.reference, flat, right=False)
        upto = torch.searchsorted(self.reference, flat, right=True)
        rank = (below + upto).double() / (2.0 * self.reference.numel())
        level = torch.searchsorted(self.cdf, rank).clamp(max=BINS - 1)
        return (level.double() / (BINS - 1)).reshape(values.shape)

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        mapped = self.target(values).to(values.device)
        if self.blend == 1.0:
            return mapped.to(values.dtype)
        return ((1.0 - self.blend) * values.double() + self.blend * mapped).to(values.dtype)
