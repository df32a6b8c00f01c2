"""The accountant of AIM (McKenna, Mullins, Sheldon, Miklau, "AIM: An Adaptive and Iterative
Mechanism for Differentially Private Synthetic Data", VLDB 2022): a ρ-zCDP budget spent by
noisy marginals and exponential-mechanism selections whose number and scales the mechanism
picks as it runs.

Steps, on a table's k attributes (its declared columns and the label) discretised by public
rules:
- a Gaussian measurement of one marginal (a histogram over one or two attributes) plus
  N(0, σ²) per cell: replacing one record moves one count down by 1 and one up by 1 (nothing
  where both fall in the same cell), L2 sensitivity √2, so the step is ρ = 2/(2σ²) = 1/σ²-zCDP;
- a selection by the exponential mechanism among candidate marginals with integer scores of
  sensitivity Δ (``SCORE_SENSITIVITY`` per unit of weight) at a rate γ ≤ ε/(2Δ): ε-bounded
  range, hence ε²/8-zCDP (Cesar, Rogers 2021, Lemma 3.2).

The budget is ρ; T planned rounds (``params.ROUNDS_PER_ATTRIBUTE`` per attribute by default)
fix the first scales: σ₀ with 1/σ₀² = 0.9ρ/T and ε₀ with ε₀²/8 = 0.1ρ/T. The k one-way
marginals are measured at σ₀; then each round selects and measures one marginal, halving σ
and doubling ε when the model stops improving, and spends what is left of ρ on its last
round. Before each step the mechanism checks, in exact rational arithmetic, that the steps so
far plus this one stay within ρ (``release``). The steps' parameters are chosen adaptively
from earlier outputs; zCDP composes under such choices as long as their sum never passes ρ (a
Rényi privacy filter at every order: Feldman, Zrnic 2021, Thm 3.1; Whitehouse et al. 2023), so
the whole run is ρ-zCDP: Rényi divergence at most αρ at every order α, converted to (ε, δ) at
the charged δ.

The calibrated scale is σ₀: ρ = T/(0.9σ₀²). No measurement's σ is below σ₀/√T (one Gaussian
step taking 0.9ρ, the most any can): the floor the sampler is declared ``at_least``.

k is public: the declared columns (each categorical column once) plus the label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpcore.accounting.accountant import Event
from dpcore.accounting.composition import Cost
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.accounting.per_record import integer, positive

# Squared L2 change of one histogram when one record is replaced by another.
HISTOGRAM_SENSITIVITY_SQUARED = 2
HISTOGRAM_SENSITIVITY = math.sqrt(HISTOGRAM_SENSITIVITY_SQUARED)
# L1 change of one histogram when one record is replaced (a score's change per unit of
# weight, before the grid scales it).
MARGINAL_L1_SENSITIVITY = 2
# The budget's shares: the Gaussian measurements' and the selections'.
GAUSSIAN_SHARE = Fraction(9, 10)


def attributes_of(n_columns: int) -> int:
    """k: the declared columns and the label."""
    return integer("n_columns", n_columns) + 1


def gaussian_cost(sigma: float) -> Fraction:
    """zCDP ρ of one noisy histogram with std ``sigma`` (exact in the float's value)."""
    return Fraction(HISTOGRAM_SENSITIVITY_SQUARED, 2) / Fraction(sigma) ** 2


def selection_cost(epsilon: Fraction) -> Fraction:
    """zCDP ρ of one ε-bounded-range selection."""
    return epsilon**2 / 8


@dataclass(frozen=True)
class AIMEvent:
    """One AIM release on a table of ``n_columns`` declared columns, σ₀ = ``sigma``, planned
    over ``rounds`` rounds."""

    n_columns: int
    sigma: float
    rounds: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_columns", integer("n_columns", self.n_columns))
        object.__setattr__(self, "sigma", positive("sigma", self.sigma))
        object.__setattr__(self, "rounds", integer("rounds", self.rounds))

    @property
    def attributes(self) -> int:
        return attributes_of(self.n_columns)

    @property
    def rho(self) -> float:
        """The run's zCDP budget: T/(0.9σ₀²)."""
        return float(self.rounds * gaussian_cost(self.sigma) / GAUSSIAN_SHARE)

    @property
    def selection_epsilon(self) -> float:
        """ε₀ of the first selections: ε₀²/8 = 0.1ρ/T."""
        return math.sqrt(8.0 * float(1 - GAUSSIAN_SHARE) * self.rho / self.rounds)

    @property
    def sigma_floor(self) -> float:
        """The smallest σ any measurement may take: one taking 0.9ρ."""
        return self.sigma / math.sqrt(self.rounds)

    def rdp(self) -> tuple[float, ...]:
        return tuple(float(a) * self.rho for a in np.asarray(ORDERS, dtype=np.float64))

    def epsilon(self, delta: float) -> float:
        return epsilon_from_rdp(self.rdp(), delta=delta)

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())

    def noise(self) -> NoiseDescription:
        return NoiseDescription(
            scales=(
                NoiseScale(
                    "one_way",
                    self.sigma,
                    HISTOGRAM_SENSITIVITY,
                    ("statistics",),
                    f"each of the {self.attributes} attributes' histogram (counts), and the "
                    "first rounds' marginals",
                ),
                NoiseScale(
                    "marginals",
                    self.sigma_floor,
                    HISTOGRAM_SENSITIVITY,
                    ("statistics",),
                    "each later round's marginal (counts): the first scale halved each time "
                    "the model stops improving, never below this",
                    at_least=True,
                ),
            ),
            calibrated="one_way",
            analysis={
                "attributes": float(self.attributes),
                "rho": self.rho,
                "rounds": float(self.rounds),
                "selection_epsilon": self.selection_epsilon,
            },
        )

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "aim",
            "accountant": "tight",
            "attributes": self.attributes,
            "rounds": self.rounds,
            "rho": self.rho,
            "sigma_first": self.sigma,
            "sigma_floor": self.sigma_floor,
            "selection_epsilon_first": self.selection_epsilon,
        }


def zcdp(sigma: float, keys: Mapping[str, Any]) -> Event:
    return AIMEvent(keys["n_columns"], sigma, keys["rounds"])


def guess(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    """σ₀ from ρ's usual bound ε ≤ ρ + 2√(ρ ln(1/δ)) (a start for the search)."""
    root = -math.sqrt(math.log(1 / delta)) + math.sqrt(math.log(1 / delta) + epsilon)
    rho = max(root**2, 1e-12)
    return math.sqrt(keys["rounds"] * HISTOGRAM_SENSITIVITY_SQUARED / 2 / (0.9 * rho))
