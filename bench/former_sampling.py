"""The subset sampler's former regime rule (whole-row rejection vs sort keys), kept for the
benches that compare against the former code (bench/mixing_kernels.py, bench/secure_random.py).
Releases choose their path by ``dpcore.mechanisms.sampling.subset_path``; nothing in the
service reads this module."""

from __future__ import annotations

import math

# Rejection was used while all ℓ draws were distinct with probability ≥ 1/16 and the expected
# rejection work stayed 4× below n sort keys.
MIN_ACCEPT = 1 / 16
KEY_COST_RATIO = 4


def acceptance(n: int, size: int) -> float:
    """P(``size`` draws with replacement from range(n) are distinct) = Π_{i<ℓ} (1 − i/n)."""
    return math.exp(sum(math.log1p(-i / n) for i in range(size))) if size <= n else 0.0


def uses_rejection(n: int, size: int) -> bool:
    """The former regime rule: whole-row rejection (True) or sort keys (False)."""
    p = acceptance(n, size)
    return p >= MIN_ACCEPT and size / p * KEY_COST_RATIO <= n
