"""DPMix accountants beyond the default: the paper's own (Thm 1 and Thm 3 of Lee et al.,
ISIT 2019) and the tight analysis of the record-assignment variant.

Paper, ``assignment="mixture"``: Theorem 1 as printed (``dpcore.accounting.mixing_theorem``).

Paper, ``assignment="record"`` (Theorem 3): every record joins Tp mixtures; the whole release
is one Gaussian mechanism with RDP α T p Δ²/(2ℓ²), and
ε = α* T p Δ²/(2ℓ²) + log(1/δ)/(α* − 1) with α* = 1 + √(2ℓ² log(1/δ)/(T p Δ²)).

Tight, ``assignment="record"``: each record joins k = ⌈Tℓ/n⌉ mixtures (a data-independent
assignment); replacing it moves each of those k means by at most √2/ℓ in features and in
labels, so the release is the Gaussian mechanism with squared sensitivity
k·(2/(ℓ²σ_x²) + 2/(ℓ²σ_y²)) in noise units: μ-GDP with that μ, converted exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpcore.accounting.accountant import sigma_y_of
from dpcore.accounting.composition import Cost
from dpcore.accounting.events import NoiseDescription
from dpcore.accounting.mixing_theorem import (
    PAPER_MAX_ORDER,
    theorem1_curve_epsilon,
    theorem1_rdp,
)
from dpcore.accounting.orders import ORDERS
from dpcore.mechanisms.dpmix.accounting import _mixing_noise, guess_sigma

ASSIGNMENTS = ("mixture", "record")


@dataclass(frozen=True)
class DPMixPaperEvent:
    """DPMix as the paper analyses it (features in [0, 1], Δ² from the dimensions)."""

    n: int
    mixture_degree: int
    n_samples: int
    sigma_x: float
    sigma_y: float
    d_x: int
    d_y: int
    assignment: str = "mixture"

    def __post_init__(self) -> None:
        for name in ("n", "mixture_degree", "n_samples", "d_x", "d_y"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("sigma_x", "sigma_y"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
            object.__setattr__(self, name, value)
        if not 1 <= self.mixture_degree <= self.n:
            raise ValueError(f"mixture_degree must be between 1 and n={self.n}")
        if self.n_samples < 1 or self.d_x < 1 or self.d_y < 1:
            raise ValueError("n_samples, d_x and d_y must be >= 1")
        if self.assignment not in ASSIGNMENTS:
            raise ValueError(f"assignment must be one of {ASSIGNMENTS}")

    @property
    def delta_sq(self) -> float:
        """The paper's Δ² = d_X/σ_X² + d_Y/σ_Y²."""
        return self.d_x / self.sigma_x**2 + self.d_y / self.sigma_y**2

    @property
    def p(self) -> float:
        return self.mixture_degree / self.n

    def _records_mixtures(self) -> float:
        """Tp of Theorem 3. dprelease's sampler makes every record join exactly ⌈Tp⌉
        mixtures, so the theorem is evaluated with that (equal to Tp when Tp is an integer)."""
        return float(-(-self.n_samples * self.mixture_degree // self.n))

    def _theorem1_curve(self) -> np.ndarray:
        """T ε′_α for α = 2 … 256."""
        per_mixture = theorem1_rdp(
            q=self.p, delta_sq_over_ell_sq=self.delta_sq / self.mixture_degree**2
        )
        return self.n_samples * per_mixture

    def epsilon(self, delta: float) -> float:
        log_inv_delta = math.log(1 / delta)
        if self.assignment == "record":
            tp = self._records_mixtures()
            a = tp * self.delta_sq / (2 * self.mixture_degree**2)
            alpha = 1 + math.sqrt(log_inv_delta / a)
            return alpha * a + log_inv_delta / (alpha - 1)
        return theorem1_curve_epsilon(self._theorem1_curve(), delta)

    def rdp(self) -> tuple[float, ...]:
        """The paper's RDP bound on the ledger's grid of orders.

        Integer orders 2…256 come from the theorem; orders in between are filled by linear
        interpolation of (α − 1)·RDP(α), an upper bound because (α − 1)D_α is convex in α
        (the same argument as WBK's Corollary 10); orders above 256 are not covered (inf).
        """
        if self.assignment == "record":
            a = self._records_mixtures() * self.delta_sq / (2 * self.mixture_degree**2)
            return tuple(float(order * a) for order in ORDERS)
        alphas = np.arange(1, PAPER_MAX_ORDER + 1, dtype=float)
        scaled = np.concatenate(([0.0], self._theorem1_curve() * (alphas[1:] - 1)))
        curve = []
        for order in ORDERS:
            if order > PAPER_MAX_ORDER:
                curve.append(math.inf)
            else:
                curve.append(float(np.interp(order, alphas, scaled) / (order - 1)))
        return tuple(curve)

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())

    def noise(self) -> NoiseDescription:
        return _mixing_noise(self.sigma_x, self.sigma_y, self.mixture_degree)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": "dpmix", "accountant": "paper", **asdict(self)}


def paper(sigma: float, keys: Mapping[str, Any]) -> DPMixPaperEvent:
    return DPMixPaperEvent(
        keys["n"],
        keys["mixture_degree"],
        keys["n_samples"],
        sigma,
        sigma_y_of(sigma, keys),
        keys["d_x"],
        keys["d_y"],
        keys["assignment"],
    )


def guess_paper(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    return guess_sigma(keys, epsilon, delta) * math.sqrt(keys["d_x"] + keys["d_y"])
