"""Accountants of local perturbation, the first baseline of Lee et al., ISIT 2019, Section IV
(``../shared/seeds/000_…``): (x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i.

Records are unit-scale (``dpcore.accounting.per_record``): replacing record i changes only its
own released row, by ≤ √2 in features and ≤ √2 in labels.

- ``tight``: the row is the Gaussian mechanism, μ-GDP with μ = √(2/σ_x² + 2/σ_y²) (the two
  blocks scaled by their noise stds form one Gaussian), converted to (ε, δ) exactly.
- ``paper``: the paper calls local perturbation "the Gaussian mechanism applied to each data
  point, i.e. ℓ = 1", read here as its Theorem 1 with ℓ = 1 and T = n mixtures
  (``dpcore.accounting.mixing_theorem``, sampling ratio p = 1/n, Δ² = d_X/σ_x² + d_Y/σ_y²).
  That reading treats each released row as a *uniformly drawn* record (amplification by
  sampling), which is not what the mechanism does: it releases every record once, so a given
  record is in the output with probability 1. It is NOT a valid bound for this mechanism
  (report it, never ledger it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpcore.accounting.accountant import Event, sigma_y_of
from dpcore.accounting.composition import ApproximateDPEvent, GaussianEvent
from dpcore.accounting.events import NoiseDescription
from dpcore.accounting.mixing_theorem import theorem1_curve_epsilon, theorem1_rdp
from dpcore.accounting.per_record import (
    FEATURE_SENSITIVITY,
    LABEL_SENSITIVITY,
    check_delta,
    integer,
    positive,
    row_noise,
)


@dataclass(frozen=True)
class LocalPerturbationEvent(GaussianEvent):
    """Every record released once with Gaussian noise: μ-GDP, μ = √(2/σ_x² + 2/σ_y²)."""

    n: int
    sigma_x: float
    sigma_y: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", integer("n", self.n))
        object.__setattr__(self, "sigma_x", positive("sigma_x", self.sigma_x))
        object.__setattr__(self, "sigma_y", positive("sigma_y", self.sigma_y))

    @property
    def mu(self) -> float:
        return math.sqrt(
            (FEATURE_SENSITIVITY / self.sigma_x) ** 2 + (LABEL_SENSITIVITY / self.sigma_y) ** 2
        )

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "local_perturbation",
            "accountant": "tight",
            "mu": self.mu,
            **asdict(self),
        }


@dataclass(frozen=True)
class LocalPerturbationPaperEvent(ApproximateDPEvent):
    """The paper's reading: Theorem 1 with ℓ = 1 and T = n (not valid, see module)."""

    n: int
    sigma_x: float
    sigma_y: float
    d_x: int
    d_y: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", integer("n", self.n))
        object.__setattr__(self, "sigma_x", positive("sigma_x", self.sigma_x))
        object.__setattr__(self, "sigma_y", positive("sigma_y", self.sigma_y))
        object.__setattr__(self, "d_x", integer("d_x", self.d_x))
        object.__setattr__(self, "d_y", integer("d_y", self.d_y))

    def epsilon(self, delta: float) -> float:
        check_delta(delta)
        # Theorem 1 with ℓ = 1 and T = n mixtures (p = 1/n).
        delta_sq = self.d_x / self.sigma_x**2 + self.d_y / self.sigma_y**2
        curve = self.n * theorem1_rdp(q=1 / self.n, delta_sq_over_ell_sq=delta_sq)
        return theorem1_curve_epsilon(np.asarray(curve), delta)

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "local_perturbation",
            "accountant": "paper",
            "reading": "Lee et al. 2019 Theorem 1 with mixture_degree = 1, n_samples = n",
            **asdict(self),
        }


def _noise(event: LocalPerturbationEvent | LocalPerturbationPaperEvent) -> NoiseDescription:
    return row_noise(
        sigma_x=event.sigma_x,
        feature_sensitivity=FEATURE_SENSITIVITY,
        sigma_y=event.sigma_y,
        features="each record's unit-scale features",
    )


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return LocalPerturbationEvent(keys["n"], sigma, sigma_y_of(sigma, keys))


def paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    return LocalPerturbationPaperEvent(
        keys["n"], sigma, sigma_y_of(sigma, keys), keys["d_x"], keys["d_y"]
    )
