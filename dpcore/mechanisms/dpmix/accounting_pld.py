"""DPMix accountant by privacy loss distributions (PLD), mixture assignment (``tight``).

Mechanism (``dpcore.mechanisms.dpmix``, mixture assignment). Each of T = ``n_samples``
mixtures draws a uniform ℓ-subset S of the n records (ℓ = ``mixture_degree``, without
replacement, independently per mixture) and releases the mean of its preprocessed features
plus N(0, σ_x² I) and the mean of its one-hot labels plus N(0, σ_y² I). Replace-one
neighbours, n public. Two records differ by at most √2 in features and in labels (see
``accounting``), so once each block is divided by its σ ("whitened") two records'
contributions to one mixture mean are at most Δ = 1/z apart, z = (1/z_x² + 1/z_y²)^(−1/2),
z_· = σ_· ℓ/√2 — the noise multiplier of ``DPMixEvent``. Write p = ℓ/n, N_v = N(v, I) in the
whitened space, and on the real line M = (1 − p)·N(0, 1) + p·N(Δ, 1).

The dominating pair of one mixture (symmetric, at every α > 0, both orders of D and D′),
its derivation (Balle–Barthe–Gaboardi coupling and advanced joint convexity, Dong–Roth–Su's
min{f_p, f_p⁻¹}**) and the numerics (connect-the-dots, precise FFT composition) live in
``dpcore.accounting.pld`` with p = ℓ/n and Δ = 1/z: DPMix is its first user.

The event's ε is the smaller of this PLD's and the RDP accountant's (``DPMixEvent``), both
valid; the RDP one wins only where one mixture's loss passes ``MAX_LOSS`` (the PLD then
reports inf; ε is in the thousands). Cost: (ε, δ) with the RDP accountant's curve alongside,
so the ledger's filter may charge either (``cost``).

DPMix's ``tight`` accountant (``dpcore/mechanisms/dpmix/__init__.py``); ``build`` and
``guess_sigma`` have the signatures ``Accountant`` expects (record assignment is delegated to
``DPMixRecordEvent``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dpcore.accounting import gdp
from dpcore.accounting.accountant import Event, sigma_y_of
from dpcore.accounting.composition import Cost
from dpcore.accounting.events import NoiseDescription

# The shared numerics, re-exported: this module's users and tests name them from here.
from dpcore.accounting.pld import (  # noqa: F401
    MAX_LOSS,
    MIN_TAIL,
    DiscretePLD,
    compose,
    composed_pld,
    default_interval,
    epsilon_of,
    hockey_stick,
    loss_top,
    mixture_pld,
    mixture_pmf,
    tail_level,
)
from dpcore.mechanisms.dpmix.accounting import (
    DPMixEvent,
    DPMixRecordEvent,
    _mixing_noise,
    calibrate_with,
)


@dataclass(frozen=True)
class DPMixPLDEvent:
    """One DPMix release (mixture assignment) accounted by the PLD of the module docstring;
    its ε is the smaller of that PLD's and ``DPMixEvent``'s (RDP), both valid."""

    n: int
    mixture_degree: int
    n_samples: int
    sigma_x: float
    sigma_y: float

    def __post_init__(self) -> None:
        # The same release as ``DPMixEvent`` (its RDP view): one validation, its normalised
        # fields kept here.
        checked = DPMixEvent(
            self.n, self.mixture_degree, self.n_samples, self.sigma_x, self.sigma_y
        )
        for name in ("n", "mixture_degree", "n_samples", "sigma_x", "sigma_y"):
            object.__setattr__(self, name, getattr(checked, name))

    @property
    def sampling_prob(self) -> float:
        return self.mixture_degree / self.n

    @property
    def noise_multiplier(self) -> float:
        """Noise multiplier of the joint Gaussian on one ℓ-subset (``DPMixEvent``'s)."""
        return self._rdp_event().noise_multiplier

    def value_discretization_interval(self, delta: float) -> float:
        """The interval of the PLD read at ``delta``."""
        tail = tail_level(delta, self.n_samples)
        return default_interval(self.sampling_prob, self.noise_multiplier, tail)

    def pld(self, delta: float) -> PrivacyLossDistribution:
        """The composed pessimistic PLD of the T mixtures, built to be read at ``delta``."""
        return composed_pld(self.sampling_prob, self.noise_multiplier, self.n_samples, delta)

    def epsilon(self, delta: float) -> float:
        return _epsilon(self, float(delta))

    def cost(self, delta: float) -> Cost:
        # The RDP curve rides along: the ledger's filter may charge the curve instead.
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self._rdp_event().rdp())

    def _rdp_event(self) -> DPMixEvent:
        return DPMixEvent(self.n, self.mixture_degree, self.n_samples, self.sigma_x, self.sigma_y)

    def noise(self) -> NoiseDescription:
        return _mixing_noise(self.sigma_x, self.sigma_y, self.mixture_degree)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "dpmix",
            "accountant": "pld",
            "sampling_prob": self.sampling_prob,
            "noise_multiplier": self.noise_multiplier,
            **asdict(self),
        }


@functools.lru_cache(maxsize=1024)
def _epsilon(event: DPMixPLDEvent, delta: float) -> float:
    # Events are immutable and hashable: calibration, preview and admission ask again.
    pld = epsilon_of(event.sampling_prob, event.noise_multiplier, event.n_samples, delta)
    # Both are valid bounds for the same release. The RDP one is smaller only where one
    # mixture's loss passes MAX_LOSS (ε in the thousands: the PLD reports inf).
    rdp = event._rdp_event().epsilon(delta)
    return min(pld, rdp)


def build(sigma: float, keys: Mapping[str, Any]) -> Event:
    """The event at σ_x = ``sigma`` from the ``tight`` accountant's keys. Record assignment
    is the Gaussian mechanism, already exact: its ``DPMixRecordEvent``."""
    args = (keys["n"], keys["mixture_degree"], keys["n_samples"], sigma, sigma_y_of(sigma, keys))
    if keys.get("assignment", "mixture") == "record":
        return DPMixRecordEvent(*args)
    return DPMixPLDEvent(*args)


def guess_sigma(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    """A starting σ_x for calibration: T mixtures seen as μ-GDP with μ² ≈ T·p²·(e^{Δ²} − 1)
    (the χ² divergence; calibration then evaluates the PLD)."""
    p = keys["mixture_degree"] / keys["n"]
    mu = gdp.mu_for_epsilon(epsilon, delta)
    d_squared = math.log1p(mu**2 / (p * p * keys["n_samples"]))
    ratio = math.inf if keys.get("sigma_y") is not None else float(keys.get("noise_ratio") or 1.0)
    # 1/z² = Δ² = (2/ℓ²)·(1/σ_x² + 1/σ_y²) with σ_y = ratio·σ_x.
    if not d_squared > 0:
        return 1.0
    return math.sqrt(2 * (1 + 1 / ratio**2) / d_squared) / keys["mixture_degree"]


def calibrate(
    *,
    n: int,
    mixture_degree: int,
    n_samples: int,
    epsilon: float,
    delta: float,
    noise_ratio: float = 1.0,
) -> DPMixPLDEvent:
    """The PLD event with the smallest σ_x (σ_y = ratio·σ_x) whose ε at δ is ≤ epsilon."""
    from dpcore.mechanisms.dpmix import TIGHT

    event = calibrate_with(
        TIGHT,
        n=n,
        mixture_degree=mixture_degree,
        n_samples=n_samples,
        epsilon=epsilon,
        delta=delta,
        noise_ratio=noise_ratio,
    )
    assert isinstance(event, DPMixPLDEvent)
    return event
