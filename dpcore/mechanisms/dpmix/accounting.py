"""DPMix accountant (``tight``): subsampled RDP for fixed-size mixtures.

Each mixture averages ``mixture_degree`` = ℓ distinct records drawn uniformly without
replacement from the n records, independently per mixture, and adds N(0, σ_x² I) to the
features and N(0, σ_y² I) to the labels. Under replace-one neighbours (n public) one mixture
is the Gaussian mechanism on the ℓ-subset composed with sampling without replacement, which
Wang–Balle–Kasiviswanathan (AISTATS 2019, Thm 27) bound in RDP; dp_accounting implements it
as ``SampledWithoutReplacementDpEvent``. T = ``n_samples`` mixtures compose.

Sensitivity of one mixture mean (replace one record inside the subset):
- features: preprocessing puts every coordinate in [0, 1] and every record in the unit L2
  ball, so for two records ‖a − b‖² = ‖a‖² + ‖b‖² − 2⟨a, b⟩ ≤ 2 because ⟨a, b⟩ ≥ 0:
  Δ_x = √2/ℓ (the norm bound alone would give 2/ℓ);
- labels: one-hot, ‖e_i − e_j‖ = √2: Δ_y = √2/ℓ.
The two Gaussian releases on the same subset form one Gaussian mechanism with noise
multiplier (1/z_x² + 1/z_y²)^(-1/2), z = σ/Δ (dp_accounting composes nested Gaussians so).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting as dpa

from dpcore.accounting.accountant import Accountant, Event, sigma_y_of
from dpcore.accounting.composition import Cost, GaussianEvent
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.accounting.wor_gaussian import rdp_wor_gaussian
from dpcore.mechanisms.record_assignment import (
    FEATURE_SENSITIVITY,  # per record, after preprocessing (see module docstring)
    LABEL_SENSITIVITY,  # one-hot labels
    mixtures_per_record,
)


@dataclass(frozen=True)
class DPMixEvent:
    """Immutable description of one DPMix release, enough to recompute its privacy curve."""

    n: int
    mixture_degree: int
    n_samples: int
    sigma_x: float
    sigma_y: float
    feature_sensitivity: float = FEATURE_SENSITIVITY
    label_sensitivity: float = LABEL_SENSITIVITY

    def __post_init__(self) -> None:
        # Plain Python numbers only: dp_accounting treats a numpy scalar noise multiplier as
        # an unsupported event and would silently drop one of the two Gaussians.
        for name in ("n", "mixture_degree", "n_samples"):
            try:
                object.__setattr__(self, name, operator.index(getattr(self, name)))
            except TypeError as exc:
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}") from exc
        for name in ("sigma_x", "sigma_y", "feature_sensitivity", "label_sensitivity"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 1 <= self.mixture_degree <= self.n:
            raise ValueError(
                f"mixture_degree must be between 1 and n={self.n}, got {self.mixture_degree}"
            )
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")
        for name in ("sigma_x", "sigma_y", "feature_sensitivity", "label_sensitivity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")

    @property
    def noise_multiplier(self) -> float:
        """Noise multiplier of the joint Gaussian on one ℓ-subset."""
        z_x = self.sigma_x * self.mixture_degree / self.feature_sensitivity
        z_y = self.sigma_y * self.mixture_degree / self.label_sensitivity
        return 1.0 / math.sqrt(1.0 / z_x**2 + 1.0 / z_y**2)

    def dp_event(self) -> dpa.DpEvent:
        ell = self.mixture_degree
        joint = dpa.ComposedDpEvent(
            [
                dpa.GaussianDpEvent(self.sigma_x * ell / self.feature_sensitivity),
                dpa.GaussianDpEvent(self.sigma_y * ell / self.label_sensitivity),
            ]
        )
        mixture = dpa.SampledWithoutReplacementDpEvent(self.n, ell, joint)
        return dpa.SelfComposedDpEvent(mixture, self.n_samples)

    def rdp(self) -> tuple[float, ...]:
        return _rdp_curve(self)

    def epsilon(self, delta: float) -> float:
        return epsilon_from_rdp(self.rdp(), delta=delta)

    def cost(self, delta: float) -> Cost:
        rdp = self.rdp()
        return Cost(epsilon=epsilon_from_rdp(rdp, delta=delta), delta=delta, rdp=rdp)

    def noise(self) -> NoiseDescription:
        return _mixing_noise(self.sigma_x, self.sigma_y, self.mixture_degree)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": "dpmix", "accountant": "tight", **asdict(self)}


@functools.lru_cache(maxsize=512)
def _rdp_curve(event: DPMixEvent) -> tuple[float, ...]:
    # Events are immutable and hashable; calibration, preview and admission ask again for the
    # curve of the same event.
    # The same bound dp_accounting's RdpAccountant computes for ``event.dp_event()`` (tests
    # pin the two against each other), evaluated much faster (docs/results/implementation.md):
    # calibration calls this often.
    per_mixture = rdp_wor_gaussian(event.mixture_degree / event.n, event.noise_multiplier, ORDERS)
    return tuple(float(v) for v in event.n_samples * per_mixture)


def calibrate(
    *,
    n: int,
    mixture_degree: int,
    n_samples: int,
    epsilon: float,
    delta: float,
    noise_ratio: float = 1.0,
) -> DPMixEvent:
    """The RDP-only DPMix event with the smallest σ_x (σ_y = ratio·σ_x) whose ε at δ is ≤
    epsilon (``tight`` itself is ``accounting_pld``, never looser than this)."""
    from dpcore.mechanisms.dpmix import TIGHT

    rdp_only = dataclasses.replace(TIGHT, name="rdp", build=tight, guess=guess_sigma)
    event = calibrate_with(
        rdp_only,
        n=n,
        mixture_degree=mixture_degree,
        n_samples=n_samples,
        epsilon=epsilon,
        delta=delta,
        noise_ratio=noise_ratio,
    )
    assert isinstance(event, DPMixEvent)
    return event


def calibrate_with(
    accountant: Accountant,
    *,
    n: int,
    mixture_degree: int,
    n_samples: int,
    epsilon: float,
    delta: float,
    noise_ratio: float = 1.0,
) -> Event:
    """``accountant``'s smallest-σ event for a mixture-assignment release (σ_y = ratio·σ_x)."""
    if not (math.isfinite(noise_ratio) and noise_ratio > 0):
        raise ValueError(f"noise_ratio must be finite and > 0, got {noise_ratio}")
    keys = {
        "n": n,
        "mixture_degree": mixture_degree,
        "n_samples": n_samples,
        "noise_ratio": noise_ratio,
    }
    return accountant.calibrate(epsilon, delta, keys)


@dataclass(frozen=True)
class DPMixRecordEvent(GaussianEvent):
    """The record-assignment variant, tight: each record joins k = ⌈Tℓ/n⌉ mixtures (a
    data-independent assignment), so replacing it moves k mixture means by at most √2/ℓ in
    features and in labels: the Gaussian mechanism, μ-GDP with
    μ² = k·(2/(ℓ²σ_x²) + 2/(ℓ²σ_y²)), converted exactly."""

    n: int
    mixture_degree: int
    n_samples: int
    sigma_x: float
    sigma_y: float

    def __post_init__(self) -> None:
        for name in ("sigma_x", "sigma_y"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
            object.__setattr__(self, name, value)
        if not 1 <= self.mixture_degree <= self.n or self.n_samples < 1:
            raise ValueError("need 1 <= mixture_degree <= n and n_samples >= 1")

    @property
    def mixtures_per_record(self) -> int:
        # The same k the sampler uses.
        return mixtures_per_record(
            n=self.n, mixture_degree=self.mixture_degree, n_samples=self.n_samples
        )

    @property
    def mu(self) -> float:
        ell = self.mixture_degree
        per_mixture = 2 / (ell**2 * self.sigma_x**2) + 2 / (ell**2 * self.sigma_y**2)
        return math.sqrt(self.mixtures_per_record * per_mixture)

    def noise(self) -> NoiseDescription:
        return _mixing_noise(self.sigma_x, self.sigma_y, self.mixture_degree)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "dpmix",
            "accountant": "tight",
            "assignment": "record",
            "mixtures_per_record": self.mixtures_per_record,
            "mu": self.mu,
            **asdict(self),
        }


def _mixing_noise(sigma_x: float, sigma_y: float, ell: int) -> NoiseDescription:
    """One mixture's mean moves by at most √2/ℓ in features and in labels."""
    return NoiseDescription(
        scales=(
            NoiseScale(
                "features",
                sigma_x,
                FEATURE_SENSITIVITY / ell,
                ("features",),
                "each mixture's mean of ℓ preprocessed feature rows",
            ),
            NoiseScale(
                "labels",
                sigma_y,
                LABEL_SENSITIVITY / ell,
                ("labels",),
                "each mixture's mean of ℓ one-hot labels",
            ),
        ),
        calibrated="features",
    )


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    args = (keys["n"], keys["mixture_degree"], keys["n_samples"], sigma, sigma_y_of(sigma, keys))
    if keys["assignment"] == "record":
        return DPMixRecordEvent(*args)
    return DPMixEvent(*args)


def guess_sigma(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    # The unamplified Gaussian's σ, scaled by the sampling ratio and √T.
    ell, n, T = keys["mixture_degree"], keys["n"], keys["n_samples"]
    sigma = math.sqrt(2 * math.log(1.25 / delta)) * 2 / (epsilon * ell)
    return sigma * max(ell / n * math.sqrt(T), 1e-3)
