"""Gaussian differential privacy (Dong, Roth, Su 2019).

A mechanism is μ-GDP iff it is (ε, δ(ε))-DP for every ε ≥ 0 with
δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (their Corollary 1; Balle & Wang 2018 for the
Gaussian mechanism). μ-GDP composes as √(Σμ²), and a μ-GDP mechanism is a post-processing of
the Gaussian N(0,1) vs N(μ,1) pair (Blackwell), so its RDP is at most α μ²/2.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

from dpcore.accounting.orders import ORDERS


def _check_mu(mu: float) -> None:
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"mu must be finite and >= 0, got {mu}")


def delta_of(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP, evaluated in log space (both Φ terms can underflow separately)."""
    _check_mu(mu)
    if mu == 0:
        return 0.0
    log_a = float(log_ndtr(-epsilon / mu + mu / 2))
    log_b = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if log_b >= log_a:
        return 0.0
    return math.exp(log_a) * -math.expm1(log_b - log_a)


def epsilon_of(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ delta, by a bracketing root finder in log ε.

    The value returned has been evaluated and satisfies δ(ε) ≤ delta (the bracket's upper end),
    so it is an upper bound on the exact ε.
    """
    _check_mu(mu)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if delta_of(mu, 0.0) <= delta:
        return 0.0
    hi = max(mu * mu / 2 + mu * math.sqrt(2 * math.log(1 / delta)), 1e-12)
    while delta_of(mu, hi) > delta:
        hi *= 2
    lo = hi / 2
    while lo > 1e-300 and delta_of(mu, lo) <= delta:
        lo /= 2
    log_eps = brentq(
        lambda t: math.log(delta_of(mu, math.exp(t)) or 1e-320) - math.log(delta),
        math.log(lo),
        math.log(hi),
        xtol=1e-13,
        rtol=1e-13,
    )
    eps = math.exp(log_eps)
    for _ in range(200):
        if delta_of(mu, eps) <= delta:
            return eps
        eps = math.nextafter(eps * (1 + 1e-12), math.inf)
    return hi


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest μ whose (ε, δ) guarantee meets ``epsilon`` at ``delta`` (δ(ε) is
    increasing in μ), returned on the safe side."""
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and delta in (0, 1), got {epsilon}, {delta}")
    lo, hi = 0.0, 1.0
    while delta_of(hi, epsilon) <= delta:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_of(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return lo


def rdp_curve(mu: float) -> tuple[float, ...]:
    """RDP of a μ-GDP mechanism on ``ORDERS``: α μ²/2."""
    _check_mu(mu)
    return tuple(float(v) for v in np.asarray(ORDERS) * mu * mu / 2)
