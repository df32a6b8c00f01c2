"""Calibration: the smallest noise whose privacy cost does not exceed a target.

Every accountant here is monotone (more noise, smaller ε), so calibration keeps a bracket
[σ_lo, σ_hi] in log σ with ε(σ_lo) > target ≥ ε(σ_hi), and narrows it until its width is
below ``rtol``. Brent's method proposes where the crossing is (a few evaluations on these
smooth curves); probes on both sides of its answer narrow the bracket, and bisection finishes
whatever Brent could not (flat stretches, plateaus). The answer is σ_hi, whose ε was evaluated
and found ≤ target: within ``rtol`` above the exact smallest σ, never below it, so calibration
never overshoots the target ε.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

from scipy.optimize import brentq


class CalibrationError(ValueError):
    """No noise level in the searched range meets the target."""


_STEP = math.log(4.0)
_LOG_MIN_SIGMA = math.log(1e-300)


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
    above the exact threshold, and its ε is guaranteed ≤ ``target``.
    """
    if not (math.isfinite(target) and target > 0):
        raise CalibrationError(f"target epsilon must be finite and > 0, got {target}")
    if not (math.isfinite(initial) and initial > 0):
        raise CalibrationError(f"initial sigma must be finite and > 0, got {initial}")
    cache: dict[float, float] = {}

    def eps(t: float) -> float:
        # Every evaluation goes through exp(t): the σ returned is exactly the σ evaluated.
        if t not in cache:
            cache[t] = epsilon_of(math.exp(t))
        return cache[t]

    def above(t: float) -> bool:
        return eps(t) > target

    # The bracket is found by galloping: each step away from ``initial`` is twice the last,
    # so a guess off by a factor F costs O(log log F) evaluations, not O(log F) (a target ε
    # of 1e300 puts the guess hundreds of factors of 4 away from the crossing).
    log_max = math.log(max_sigma)
    t_lo = t_hi = min(math.log(initial), log_max)
    step = _STEP
    if above(t_hi):
        while above(t_hi):
            if t_hi >= log_max:
                raise CalibrationError(f"no sigma up to {max_sigma:g} reaches epsilon {target}")
            t_lo, t_hi = t_hi, min(t_hi + step, log_max)
            step *= 2
    else:
        while not above(t_lo):
            if t_lo <= _LOG_MIN_SIGMA:
                return math.exp(t_lo), eps(t_lo)
            t_lo, t_hi = max(t_lo - step, _LOG_MIN_SIGMA), t_lo
            step *= 2

    def narrow(t: float) -> None:
        nonlocal t_lo, t_hi
        if t_lo < t < t_hi:
            if above(t):
                t_lo = t
            else:
                t_hi = t

    # A wide bracket (a far guess) is first halved down to one step, so that Brent's
    # proposals are not spent on an end where ε is infinite or far above the target.
    while t_hi - t_lo > _STEP:
        narrow((t_lo + t_hi) / 2)

    # Relative width in σ ≈ width in log σ. ε may be infinite at t_lo: Brent sees it capped
    # (same sign, same order), only as a proposer; the bracket is narrowed by real values.
    cap = min(2 * target + 1, sys.float_info.max)

    def gap(t: float) -> float:
        return min(eps(t), cap) - target

    try:
        root = brentq(gap, t_lo, t_hi, xtol=rtol / 4, rtol=1e-12)
        narrow(root - rtol / 2)
        narrow(root + rtol / 2)
    except (ValueError, RuntimeError):
        pass  # no sign change (ε == target at an end) or no convergence: bisection decides
    while t_hi - t_lo > rtol:
        narrow((t_lo + t_hi) / 2)
    return math.exp(t_hi), eps(t_hi)
