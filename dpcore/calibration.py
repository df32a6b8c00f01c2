"""Calibration: the smallest noise whose privacy cost does not exceed a target.

Every accountant here is monotone (more noise, smaller ε), so calibration is a bracketed
root search in log σ. The answer is always the upper end of the final bracket, whose ε was
evaluated and found ≤ target: calibration can land a hair above the exact smallest σ but
never below it, so it never overshoots the target ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy.optimize import brentq


class CalibrationError(ValueError):
    """No noise level in the searched range meets the target."""


def smallest_noise(
    epsilon_of: Callable[[float], float],
    target: float,
    *,
    initial: float = 1.0,
    rtol: float = 1e-6,
    max_sigma: float = 1e12,
) -> tuple[float, float]:
    """Return ``(sigma, epsilon_of(sigma))`` with the smallest sigma whose ε is ≤ ``target``.

    ``epsilon_of`` must be non-increasing in sigma. The result is within a relative ``rtol``
    of the exact threshold, and its ε is guaranteed ≤ ``target``.
    """
    if not (math.isfinite(target) and target > 0):
        raise CalibrationError(f"target epsilon must be finite and > 0, got {target}")
    cache: dict[float, float] = {}

    def eps(sigma: float) -> float:
        if sigma not in cache:
            cache[sigma] = epsilon_of(sigma)
        return cache[sigma]

    lo = hi = initial
    if eps(hi) > target:
        while eps(hi) > target:
            lo, hi = hi, hi * 4
            if hi > max_sigma:
                raise CalibrationError(f"no sigma up to {max_sigma:g} reaches epsilon {target}")
    else:
        while eps(lo) <= target:
            lo, hi = lo / 4, lo
            if lo < 1e-12:
                return hi, eps(hi)

    # In log space the ε-curve is smooth enough for Brent to converge in a few evaluations.
    def gap(log_sigma: float) -> float:
        return eps(math.exp(log_sigma)) - target

    root = brentq(gap, math.log(lo), math.log(hi), xtol=rtol / 4, rtol=1e-12)
    candidate = math.exp(root)
    # Step up until the candidate is on the safe side; Brent's root may sit just below.
    step = 1 + rtol / 2
    for _ in range(64):
        if eps(candidate) <= target:
            return candidate, eps(candidate)
        candidate *= step
    return hi, eps(hi)
