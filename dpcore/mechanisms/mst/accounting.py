"""The accountant of MST (McKenna, Miklau, Sheldon 2021): a table's k attributes (its columns
and the label) discretised by public rules, then three steps on the same records.

1. **One-way marginals**: the k histograms, each plus N(0, σ₁²) per cell. Replacing one record
   moves one count down by 1 and one up by 1 in each histogram (nothing where both fall in the
   same cell): L2 sensitivity √2 per histogram, √(2k) for the k together, so the step is
   μ₁-GDP with μ₁ = √(2k)/σ₁ (Dong, Roth, Su 2022, Thm 2.7).
2. **Selection**: k − 1 rounds of the exponential mechanism, each picking one pair of
   attributes (Kruskal's order: a pair joining two trees of the forest so far). A pair's
   score is H·‖M_ab − M̂_ab‖₁ in integers: M_ab the pair's histogram, M̂_ab the independent
   estimate from step 1's noisy output (fixed given it), both on the grid 1/H
   (``selection.SCORE_GRID``). Replacing one record moves M_ab by 1 in two cells, so every
   score moves by at most Δ = 2H. A round draws a pair with probability ∝ exp(γ·score),
   γ ≤ ε₀/(2Δ): ε₀-DP and ε₀-bounded-range (the log-ratio of two pairs' probabilities moves
   by at most 2γΔ ≤ ε₀), hence ε₀²/8-zCDP (Cesar, Rogers 2021, Lemma 3.2): Rényi divergence
   at most min(α ε₀²/8, ε₀) at every order α. The rounds compose adaptively.
3. **Two-way marginals**: the k − 1 chosen pairs' histograms, each plus N(0, σ₂²): μ₂-GDP with
   μ₂ = √(2(k − 1))/σ₂ (the same sensitivity √2 per histogram; which pairs were chosen is
   step 2's output).

Everything after — estimating a graphical model from the noisy marginals (Private-PGM) and
sampling records from it — reads the noisy outputs only: post-processing.

The calibrated scale is σ₁ = σ; the other two follow MST's even split of the zCDP budget:
σ₂ = σ√((k − 1)/k), so μ₂ = μ₁, and ε₀ = 2μ₁/√(k − 1), so (k − 1)ε₀²/8 = μ₁²/2. The three
steps compose by adding their Rényi curves order by order (α μ₁²/2 and α μ₂²/2 for the
Gaussian steps), converted to (ε, δ) at the charged δ.

``structure="label"`` measures every column's pair with the label instead (a public structure:
no selection step). The release is then two Gaussian steps, √(μ₁² + μ₂²)-GDP, converted
exactly; the pairs take four fifths of μ²: σ₂ = σ√((k − 1)/k)/2, so μ₂ = 2μ₁.

k is public: the declared columns (each categorical column once) plus the label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcore.accounting import gdp
from dpcore.accounting.accountant import Event
from dpcore.accounting.composition import Cost
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.accounting.per_record import integer, positive

STRUCTURES = ("tree", "label")
# L2 change of one histogram when one record is replaced by another.
HISTOGRAM_SENSITIVITY = math.sqrt(2.0)
# L1 change of one pair's histogram when one record is replaced (a score's change, before the
# grid scales it).
PAIR_L1_SENSITIVITY = 2.0


def attributes_of(n_columns: int) -> int:
    """k: the declared columns and the label."""
    return integer("n_columns", n_columns) + 1


@dataclass(frozen=True)
class MSTEvent:
    """One MST release on a table of ``n_columns`` declared columns, σ₁ = ``sigma``."""

    n_columns: int
    sigma: float
    structure: str = "tree"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_columns", integer("n_columns", self.n_columns))
        object.__setattr__(self, "sigma", positive("sigma", self.sigma))
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {self.structure!r}")

    @property
    def selects(self) -> bool:
        """Whether the pairs are chosen by the exponential mechanism (MST's tree)."""
        return self.structure == "tree"

    @property
    def attributes(self) -> int:
        return attributes_of(self.n_columns)

    @property
    def rounds(self) -> int:
        return self.attributes - 1

    @property
    def mu_one_way(self) -> float:
        return math.sqrt(self.attributes) * HISTOGRAM_SENSITIVITY / self.sigma

    @property
    def sigma_two_way(self) -> float:
        even = self.sigma * math.sqrt(self.rounds / self.attributes)
        return even if self.selects else even / 2.0

    @property
    def mu_two_way(self) -> float:
        return math.sqrt(self.rounds) * HISTOGRAM_SENSITIVITY / self.sigma_two_way

    @property
    def selection_epsilon(self) -> float:
        """ε₀ of each selection round."""
        return 2.0 * self.mu_one_way / math.sqrt(self.rounds)

    @property
    def mu(self) -> float | None:
        """The release's GDP μ where it is Gaussian steps only (``structure="label"``)."""
        return None if self.selects else math.hypot(self.mu_one_way, self.mu_two_way)

    def rdp(self) -> tuple[float, ...]:
        orders = np.asarray(ORDERS, dtype=np.float64)
        curve = orders * (self.mu_one_way**2 + self.mu_two_way**2) / 2.0
        if self.selects:
            eps0 = self.selection_epsilon
            curve = curve + self.rounds * np.minimum(orders * eps0**2 / 8.0, eps0)
        return tuple(float(v) for v in curve)

    def epsilon(self, delta: float) -> float:
        if self.mu is not None:
            return gdp.epsilon_of(self.mu, delta)
        return epsilon_from_rdp(self.rdp(), delta=delta)

    def cost(self, delta: float) -> Cost:
        if self.mu is not None:
            return Cost(epsilon=self.epsilon(delta), delta=delta, mu=self.mu)
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())

    def noise(self) -> NoiseDescription:
        return NoiseDescription(
            scales=(
                NoiseScale(
                    "one_way",
                    self.sigma,
                    HISTOGRAM_SENSITIVITY,
                    ("statistics",),
                    f"each of the {self.attributes} attributes' histogram (counts)",
                ),
                NoiseScale(
                    "two_way",
                    self.sigma_two_way,
                    HISTOGRAM_SENSITIVITY,
                    ("statistics",),
                    f"each of the {self.rounds} "
                    + ("selected pairs'" if self.selects else "columns' pair with the label:")
                    + " histogram (counts)",
                ),
            ),
            calibrated="one_way",
            analysis={"attributes": float(self.attributes)}
            | ({"selection_epsilon": self.selection_epsilon} if self.selects else {}),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "mst",
            "accountant": "tight",
            "structure": self.structure,
            "attributes": self.attributes,
            "sigma_one_way": self.sigma,
            "sigma_two_way": self.sigma_two_way,
            "selection_epsilon": self.selection_epsilon if self.selects else None,
            "selection_rounds": self.rounds if self.selects else 0,
            "mu_gaussian_steps": math.hypot(self.mu_one_way, self.mu_two_way),
        }


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return MSTEvent(keys["n_columns"], sigma, keys["structure"])


def guess(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    """σ₁ where the Gaussian steps alone would take the whole target (a start for the search:
    the selection's share puts the answer a little above it)."""
    k = attributes_of(keys["n_columns"])
    mu = gdp.mu_for_epsilon(epsilon, delta)
    return math.sqrt(3.0 * 2.0 * k) / mu
