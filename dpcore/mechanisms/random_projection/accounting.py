"""Accountants of random projection, the second baseline of Lee et al., ISIT 2019, Section IV
(``../shared/seeds/000_…``).

The mechanism draws a data-independent Gaussian matrix R (d × d_x, d =
``projection_dim``), rescales it to spectral norm s = ``spectral_norm`` and releases
(R x_i + N(0, σ² I_d), y_i + N(0, σ_y² I)) for every record i.

- ``tight``: ‖R(x − x′)‖ ≤ s‖x − x′‖ ≤ √2·s (R is fixed independently of the data, so conditioning
  on it is free), labels √2: μ-GDP with μ = √(2s²/σ² + 2/σ_y²), exact conversion.
- ``paper``: the noise std σ = s·√(log(1/(2δ)) + ε)/ε as printed (formula ``sqrt_sum``), citing
  Kenthapadi et al. (JL transform) and DPPro. Inverting for ε with r = σ/s (noise per unit of
  sensitivity): r²ε² − ε − log(1/(2δ)) = 0, so ε = (1 + √(1 + 4r² log(1/(2δ))))/(2r²). The
  alternative parenthesisation σ = s(√log(1/(2δ)) + ε)/ε (formula ``sqrt_log``) inverts to
  ε = √log(1/(2δ))/(r − 1), finite only for r > 1. Conditions of the cited result: the Gaussian
  mechanism lemma of Kenthapadi et al. needs δ < 1/2 (so that log(1/(2δ)) > 0) and
  σ ≥ Δ·√(2(log(1/(2δ)) + ε))/ε, whose proof is the tail bound P[N(0,1) > t] ≤ ½e^{−t²/2} at
  t² ≥ 2 log(1/(2δ)) + ε; the printed formula lacks the factor 2 under the root (it gives
  t² ≥ log(1/(2δ)) only, i.e. a tail ½√(2δ) ≫ δ). It also takes Δ = σ(R) = s, i.e. ‖x − x′‖ ≤ 1,
  while replace-one gives √2·s. Not a valid bound (report only). Labels: Section IV says nothing
  about them (the random-projection data is used to train a classifier, so they are released
  in some form). dprelease releases them with N(0, σ_y²) and charges them with the same cited
  formula in the paper's own convention (per-block input difference ≤ 1): the pair is one
  Gaussian mechanism on (R x/σ, y/σ_y) whose sensitivity in noise units is √(s²/σ² + 1/σ_y²),
  i.e. r = (s²/σ² + 1/σ_y²)^(−1/2) in the inversion above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpcore.accounting.accountant import Event, sigma_y_of
from dpcore.accounting.composition import ApproximateDPEvent, GaussianEvent
from dpcore.accounting.events import NoiseDescription
from dpcore.accounting.per_record import (
    FEATURE_SENSITIVITY,
    LABEL_SENSITIVITY,
    integer,
    positive,
    row_noise,
)

PAPER_FORMULAS = ("sqrt_sum", "sqrt_log")


@dataclass(frozen=True)
class RandomProjectionEvent(GaussianEvent):
    """R x_i + N(0, σ² I) and y_i + N(0, σ_y² I) per record: μ = √(2s²/σ² + 2/σ_y²)."""

    n: int
    projection_dim: int
    spectral_norm: float
    sigma: float
    sigma_y: float

    def __post_init__(self) -> None:
        _coerce_projection(self)

    @property
    def mu(self) -> float:
        feature = FEATURE_SENSITIVITY * self.spectral_norm / self.sigma
        return math.sqrt(feature**2 + (LABEL_SENSITIVITY / self.sigma_y) ** 2)

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "random_projection",
            "accountant": "tight",
            "mu": self.mu,
            **asdict(self),
        }


def paper_epsilon(ratio: float, delta: float, formula: str = "sqrt_sum") -> float:
    """ε solving the paper's σ = s·f(ε, δ) for the noise-to-sensitivity ratio r = σ/s.

    ``sqrt_sum``: r = √(log(1/(2δ)) + ε)/ε → ε = (1 + √(1 + 4r²L))/(2r²);
    ``sqrt_log``: r = (√L + ε)/ε → ε = √L/(r − 1) (inf for r ≤ 1); L = log(1/(2δ)).
    """
    if not 0 < delta < 0.5:
        raise ValueError(f"the cited Gaussian bound needs delta in (0, 1/2), got {delta}")
    r = positive("ratio", ratio)
    log_term = math.log(1 / (2 * delta))
    if formula == "sqrt_sum":
        return (1 + math.sqrt(1 + 4 * r * r * log_term)) / (2 * r * r)
    if formula == "sqrt_log":
        return math.sqrt(log_term) / (r - 1) if r > 1 else math.inf
    raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}, got {formula!r}")


def paper_sigma(epsilon: float, delta: float, formula: str = "sqrt_sum") -> float:
    """The paper's noise-to-sensitivity ratio σ/s for (ε, δ), as printed."""
    eps = positive("epsilon", epsilon)
    if not 0 < delta < 0.5:
        raise ValueError(f"the cited Gaussian bound needs delta in (0, 1/2), got {delta}")
    log_term = math.log(1 / (2 * delta))
    if formula == "sqrt_sum":
        return math.sqrt(log_term + eps) / eps
    if formula == "sqrt_log":
        return (math.sqrt(log_term) + eps) / eps
    raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}, got {formula!r}")


@dataclass(frozen=True)
class RandomProjectionPaperEvent(ApproximateDPEvent):
    """The paper's stated noise level inverted for ε (not valid, see module docstring)."""

    n: int
    projection_dim: int
    spectral_norm: float
    sigma: float
    sigma_y: float
    formula: str = "sqrt_sum"

    def __post_init__(self) -> None:
        _coerce_projection(self)
        if self.formula not in PAPER_FORMULAS:
            raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}")

    @property
    def ratio(self) -> float:
        """r: noise per unit of the paper's sensitivity, features (s) and labels (1) jointly."""
        return 1.0 / math.sqrt((self.spectral_norm / self.sigma) ** 2 + 1 / self.sigma_y**2)

    def epsilon(self, delta: float) -> float:
        return paper_epsilon(self.ratio, delta, self.formula)

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "random_projection",
            "accountant": "paper",
            "ratio": self.ratio,
            **asdict(self),
        }


def _coerce_projection(event: RandomProjectionEvent | RandomProjectionPaperEvent) -> None:
    object.__setattr__(event, "n", integer("n", event.n))
    object.__setattr__(event, "projection_dim", integer("projection_dim", event.projection_dim))
    for name in ("spectral_norm", "sigma", "sigma_y"):
        object.__setattr__(event, name, positive(name, getattr(event, name)))


def _noise(event: RandomProjectionEvent | RandomProjectionPaperEvent) -> NoiseDescription:
    return row_noise(
        sigma_x=event.sigma,
        feature_sensitivity=FEATURE_SENSITIVITY * event.spectral_norm,
        sigma_y=event.sigma_y,
        features="each record's projection R x (spectral norm s)",
    )


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return RandomProjectionEvent(
        keys["n"],
        keys["projection_dim"],
        keys["spectral_norm"],
        sigma,
        sigma_y_of(sigma, keys),
    )


def paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    return RandomProjectionPaperEvent(
        keys["n"],
        keys["projection_dim"],
        keys["spectral_norm"],
        sigma,
        sigma_y_of(sigma, keys),
        keys["formula"],
    )
