"""Composition of costs fixed in advance into one (ε, δ), and the ledger's ``Cost``.

NOT an admission rule: the minimum below is valid for a sequence of releases chosen before any
of them runs (``dprelease account`` of a planned batch, say). Releases chosen adaptively — the
owner sees each before asking for the next — are admitted by the privacy filter of
``dpcore.accounting.filter`` instead (docs/privacy.md, "The ledger").

Every one of these bounds is valid for a fixed sequence and the smallest is reported:
- RDP composition: add the curves of the entries that have one, convert at the remaining δ
  (the budget's δ minus the δ's of entries known only as (ε, δ)), then add those entries' ε;
- GDP composition, when every entry is μ-GDP: √(Σμ²)-GDP, converted exactly;
- basic composition: Σε at Σδ, usable when Σδ does not pass the budget's δ.
A μ-GDP entry also carries its RDP curve α μ²/2, so it joins the RDP composition of mixed
ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpcore.accounting import gdp
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp


@dataclass(frozen=True)
class Cost:
    """What one release costs: (ε, δ) and, when known, its RDP curve on ``ORDERS`` and its
    GDP μ."""

    epsilon: float
    delta: float
    rdp: tuple[float, ...] | None = None
    mu: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"cost epsilon must be finite and >= 0, got {self.epsilon}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"cost delta must be in [0, 1), got {self.delta}")
        if self.rdp is not None and len(self.rdp) != len(ORDERS):
            raise ValueError(f"cost rdp needs {len(ORDERS)} values, got {len(self.rdp)}")
        if self.mu is not None:
            if not (math.isfinite(self.mu) and self.mu >= 0):
                raise ValueError(f"cost mu must be finite and >= 0, got {self.mu}")
            if self.rdp is None:
                object.__setattr__(self, "rdp", gdp.rdp_curve(self.mu))


def compose_epsilon(costs: Sequence[Cost], *, delta: float) -> float:
    """The smallest valid ε of running every cost, at total ``delta`` (inf if none fits)."""
    if not costs:
        return 0.0
    bounds = [math.inf]

    total_delta = math.fsum(c.delta for c in costs)
    if total_delta <= delta:
        bounds.append(math.fsum(c.epsilon for c in costs))

    with_curve = [c for c in costs if c.rdp is not None]
    without = [c for c in costs if c.rdp is None]
    delta_left = delta - math.fsum(c.delta for c in without)
    if with_curve and delta_left > 0:
        curve = np.sum([np.asarray(c.rdp, dtype=np.float64) for c in with_curve], axis=0)
        rdp_eps = epsilon_from_rdp(curve.tolist(), delta=delta_left)
        bounds.append(rdp_eps + math.fsum(c.epsilon for c in without))
    if all(c.mu is not None for c in costs):
        bounds.append(gdp.epsilon_of(math.sqrt(math.fsum(c.mu**2 for c in costs)), delta))  # type: ignore[operator]
    return min(bounds)


class ApproximateDPEvent:
    """Mixin for events known only as (ε, δ) (no RDP curve or GDP μ): their ledger cost is
    their ε at the charged δ."""

    def epsilon(self, delta: float) -> float:
        raise NotImplementedError

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta)


class GaussianEvent:
    """Mixin for events that are μ-GDP: they define ``mu``; their ε at any δ and their ledger
    cost (μ plus its RDP curve) follow from it."""

    @property
    def mu(self) -> float:
        raise NotImplementedError

    def epsilon(self, delta: float) -> float:
        return gdp.epsilon_of(self.mu, delta)

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta, mu=self.mu)
