"""DPMix accountants beyond the default: the paper's own (Thm 1 and Thm 3 of Lee et al.,
ISIT 2019) and the tight analysis of the record-assignment variant.

Paper, ``assignment="mixture"`` (Theorem 1): with p = ℓ/n (the printed binom(ℓ, n) is a typo),
Δ² = d_X/σ_X² + d_Y/σ_Y² and the base mechanism's RDP ε(α) = αΔ²/(2ℓ²),

    ε′_α = log(1 + p² C(α,2) min(4(e^{ε(2)} − 1), 2e^{ε(2)}) + 4 G(α)) / (α − 1),
    G(α) = Σ_{j=3}^{α} p^j C(α,j) √(B(2⌊j/2⌋) B(2⌈j/2⌉)),
    B(k) = Σ_{i=0}^{k} (−1)^i C(k,i) e^{i(i−1)Δ²/(2ℓ²)},
    ε = min_{α ∈ {2,…,256}} T ε′_α + log(1/δ)/(α − 1).

The printed min-term exponent e^{Δ²/2} is read as e^{ε(2)} = e^{Δ²/ℓ²}, as in the theorem it
applies (WBK Thm 27, the paper's Thm 4) and as in B's own exponent. B(k) is the k-th forward
difference of x ↦ e^{(x−1)ε(x)} at 0; it is evaluated in log space with signs by the same
stable scheme dp_accounting uses for WBK's bound (equivalently: a Gaussian with noise
multiplier z = ℓ/Δ, whose cgf is x(x+1)/(2z²)).

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
from scipy.special import gammaln, logsumexp

from dpcore.accounting.composition import Cost
from dpcore.accounting.dpmix import (
    ASSIGNMENT_KEY,
    ASSIGNMENTS,
    COMMON_KEYS,
    guess_sigma,
    sigma_y_of,
)
from dpcore.accounting.orders import ORDERS
from dpcore.accounting.registry import Accountant, Key, register
from dpcore.accounting.wor_gaussian import forward_diff_logs

PAPER_MAX_ORDER = 256


def _log_comb(n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return np.asarray(
        gammaln(np.add(n, 1)) - gammaln(np.add(k, 1)) - gammaln(np.subtract(n, k) + 1)
    )


def theorem1_rdp(*, q: float, delta_sq_over_ell_sq: float) -> np.ndarray:
    """ε′_α for α = 2, …, 256 (index α − 2): one mixture's RDP per Theorem 1."""
    eps2 = delta_sq_over_ell_sq  # ε(2) = 2·Δ²/(2ℓ²)
    if eps2 == 0 or q == 0:
        return np.zeros(PAPER_MAX_ORDER - 1)
    z = 1.0 / math.sqrt(delta_sq_over_ell_sq)  # Gaussian with ε(α) = α/(2z²)
    log_b = forward_diff_logs(z, PAPER_MAX_ORDER)
    alphas = np.arange(2, PAPER_MAX_ORDER + 1)
    log_q = math.log(q) if q > 0 else -math.inf
    # j = 2 term: p² C(α,2) min(4(e^{ε(2)} − 1), 2e^{ε(2)}).
    log_min = min(math.log(4) + eps2 + math.log(-math.expm1(-eps2)), math.log(2) + eps2)
    term2 = 2 * log_q + _log_comb(alphas, 2) + log_min
    # j ≥ 3 terms: 4 p^j C(α,j) √(B(2⌊j/2⌋) B(2⌈j/2⌉)); B(k) sits at index k − 1 of log_b
    # (dp_accounting's layout, whose first entry is the value at x = −1).
    j = np.arange(3, PAPER_MAX_ORDER + 1)
    half = 0.5 * (log_b[2 * (j // 2) - 1] + log_b[2 * ((j + 1) // 2) - 1])
    per_j = math.log(4) + half + j * log_q
    out = np.empty(len(alphas))
    for index, alpha in enumerate(alphas):
        upto = j <= alpha
        terms = np.concatenate(
            ([0.0, term2[index]], per_j[upto] + _log_comb(float(alpha), j[upto]))
        )
        out[index] = logsumexp(terms) / (alpha - 1)
    return out


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
        alphas = np.arange(2, PAPER_MAX_ORDER + 1)
        return float(np.min(self._theorem1_curve() + log_inv_delta / (alphas - 1)))

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

    def noise(self) -> dict[str, float]:
        return {"sigma_x": self.sigma_x, "sigma_y": self.sigma_y}

    def describe(self) -> dict[str, Any]:
        return {"mechanism": "dpmix", "accountant": "paper", **asdict(self)}


def _paper(sigma: float, keys: Mapping[str, Any]) -> DPMixPaperEvent:
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


PAPER = register(
    Accountant(
        mechanism="dpmix",
        name="paper",
        summary="Lee et al. Thm 1 (mixture assignment) or Thm 3 (record assignment) as printed, "
        "with the paper's sensitivity Δ² = d_x/σ_x² + d_y/σ_y²",
        keys=(
            *COMMON_KEYS,
            Key("d_x", int, "feature dimension d_X"),
            Key("d_y", int, "label dimension d_Y (number of classes)"),
            ASSIGNMENT_KEY,
        ),
        build=_paper,
        guess=lambda keys, eps, delta: (
            guess_sigma(keys, eps, delta) * math.sqrt(keys["d_x"] + keys["d_y"])
        ),
    )
)
