"""Shape rules several mechanisms share: public functions of a dataset's shape (re-exported by
``dpcore.mechanisms.spec``)."""

from __future__ import annotations

import math


def row_shrink(n_features: int, max_norm: float = 1.0) -> float:
    """How much the norm bound may scale a row down: features in [0, 1] have norm ≤ √d."""
    return max(1.0, math.sqrt(n_features) / max_norm)


# The mixing degree ℓ of dpmix, dpcda and sgdrm when none is given: ℓ = 16 where n is large
# enough, down to 4 on small tables, where a larger ℓ stops paying (the measurements behind
# it: docs/results/defaults.md).
MIXING_DEGREE_RULE = (
    "clamp(⌊n/32⌋, 4, 16), at most n (measured: docs/results/sweet_spot.md, tabular.md)"
)


def mixing_degree(n: int) -> int:
    return min(n, 16, max(4, n // 32))
