"""The typed contract between an accountant and the code that adds noise.

Every event describes every Gaussian noise its mechanism adds — a named list of scales, each
with its standard deviation, the L2 sensitivity (per noised row) the analysis assumed and what
it perturbs — and the analysis parameters it fixed (say, a coupling bound chosen for the target
ε). A release stores that description; the worker plans its noise sampler from it and refuses
any noise a generator asks for that the description does not declare.

A mechanism made of several data-dependent steps (statistics, then mixing; a clustering, then
per-cluster noise; k-means, then DP-SGD) is one ``ComposedEvent`` of its steps: their costs
compose into one ledger entry and their noise scales into one list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dpcore.accounting.composition import Cost


class Event(Protocol):
    """What an accountant returns (``dpcore.accounting.accountant``): ε at any δ, the ledger
    cost, the noise it adds and its description."""

    def epsilon(self, delta: float) -> float: ...
    def cost(self, delta: float) -> Cost: ...
    def noise(self) -> NoiseDescription: ...
    def describe(self) -> dict[str, Any]: ...


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


@dataclass(frozen=True)
class NoiseScale:
    """One Gaussian noise: N(0, sigma²) on every entry of each noised row, where one record
    moves a row by at most ``sensitivity`` in L2 (what the accountant assumed).

    ``at_least``: the mechanism chooses each measurement's σ as it runs (from its released
    outputs), never below ``sigma``; its accountant bounds the whole run whatever it chooses
    (a privacy filter, e.g. AIM's zCDP budget)."""

    name: str
    sigma: float
    sensitivity: float
    perturbs: tuple[str, ...]
    description: str = ""
    at_least: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a noise scale needs a name")
        object.__setattr__(self, "sigma", _positive(f"{self.name} sigma", self.sigma))
        object.__setattr__(
            self, "sensitivity", _positive(f"{self.name} sensitivity", self.sensitivity)
        )
        object.__setattr__(self, "perturbs", tuple(self.perturbs))

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "perturbs": list(self.perturbs),
            "description": self.description,
            "at_least": self.at_least,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> NoiseScale:
        return cls(
            name=str(value["name"]),
            sigma=float(value["sigma"]),
            sensitivity=float(value["sensitivity"]),
            perturbs=tuple(str(p) for p in value.get("perturbs", ())),
            description=str(value.get("description", "")),
            at_least=bool(value.get("at_least", False)),
        )


@dataclass(frozen=True)
class NoiseDescription:
    """Every Gaussian noise of a release. ``calibrated`` names the scale calibration searches
    (the request's ``noise.sigma_x`` sets it); ``analysis`` holds parameters the accountant
    fixed that the mechanism must use too."""

    scales: tuple[NoiseScale, ...]
    calibrated: str
    analysis: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scales", tuple(self.scales))
        names = [s.name for s in self.scales]
        if len(set(names)) != len(names):
            raise ValueError(f"noise scale names must be unique, got {names}")
        if self.calibrated not in names:
            raise ValueError(f"calibrated scale {self.calibrated!r} is not among {names}")
        object.__setattr__(self, "analysis", {k: float(v) for k, v in self.analysis.items()})

    def scale(self, name: str) -> NoiseScale:
        for scale in self.scales:
            if scale.name == name:
                return scale
        raise KeyError(f"no noise scale {name!r}; declared: {[s.name for s in self.scales]}")

    def sigma(self, name: str) -> float:
        return self.scale(name).sigma

    def perturbing(self, target: str) -> NoiseScale | None:
        """The scale that perturbs ``target`` (e.g. "labels"), if one does."""
        return next((s for s in self.scales if target in s.perturbs), None)

    @property
    def sigma_x(self) -> float:
        """The calibrated scale's σ (the request's ``noise.sigma_x``)."""
        return self.sigma(self.calibrated)

    @property
    def sigma_y(self) -> float | None:
        """σ of the noise on labels; None when labels are not noised."""
        labels = self.perturbing("labels")
        return None if labels is None else labels.sigma

    def to_json(self) -> dict[str, Any]:
        return {
            "sigma_x": self.sigma_x,
            "sigma_y": self.sigma_y,
            "calibrated": self.calibrated,
            "scales": [s.to_json() for s in self.scales],
            "analysis": dict(self.analysis),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> NoiseDescription:
        return cls(
            scales=tuple(NoiseScale.from_json(s) for s in value["scales"]),
            calibrated=str(value["calibrated"]),
            analysis=dict(value.get("analysis") or {}),
        )

    @staticmethod
    def combine(parts: Sequence[NoiseDescription], calibrated: str) -> NoiseDescription:
        analysis: dict[str, float] = {}
        for part in parts:
            analysis.update(part.analysis)
        return NoiseDescription(
            scales=tuple(s for part in parts for s in part.scales),
            calibrated=calibrated,
            analysis=analysis,
        )


@dataclass(frozen=True)
class GaussianQuery:
    """One Gaussian mechanism on a data-dependent vector (e.g. sums for statistics): replace-one
    moves the vector by at most ``scale.sensitivity``, so it is μ-GDP with μ = Δ/σ (Dong, Roth,
    Su 2022, Thm 2.7)."""

    scale: NoiseScale

    @property
    def mu(self) -> float:
        return self.scale.sensitivity / self.scale.sigma

    def epsilon(self, delta: float) -> float:
        from dpcore.accounting import gdp

        return gdp.epsilon_of(self.mu, delta)

    def cost(self, delta: float) -> Cost:
        from dpcore.accounting.composition import Cost

        return Cost(epsilon=self.epsilon(delta), delta=delta, mu=self.mu)

    def noise(self) -> NoiseDescription:
        return NoiseDescription(scales=(self.scale,), calibrated=self.scale.name)

    def describe(self) -> dict[str, Any]:
        return {"gaussian_query": self.scale.to_json(), "mu": self.mu}


@dataclass(frozen=True)
class ComposedEvent:
    """Several steps of one release, run on the same data one after the other (each may depend
    on the previous outputs: adaptive composition). Their Rényi curves add order by order (and
    their μ's in quadrature when all are μ-GDP), so they are one ledger entry.
    ``calibrated`` names the scale calibration moves; the other steps are fixed by the
    request."""

    steps: tuple[Event, ...]
    calibrated: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise ValueError("a composed event needs at least one step")
        self.noise()  # validates the scale names

    def rdp(self) -> tuple[float, ...]:
        import numpy as np

        from dpcore.accounting import gdp

        curves = []
        for step in self.steps:
            if hasattr(step, "rdp"):
                curves.append(np.asarray(step.rdp(), dtype=np.float64))
            elif getattr(step, "mu", None) is not None:
                curves.append(np.asarray(gdp.rdp_curve(step.mu), dtype=np.float64))  # type: ignore[attr-defined]
            else:
                raise ValueError("every composed step needs a Rényi curve or a GDP μ")
        return tuple(float(v) for v in np.sum(curves, axis=0))

    @property
    def mu(self) -> float | None:
        mus = [getattr(step, "mu", None) for step in self.steps]
        if any(m is None for m in mus):
            return None
        return math.sqrt(math.fsum(float(m) ** 2 for m in mus))  # type: ignore[arg-type]

    def epsilon(self, delta: float) -> float:
        return self.cost(delta).epsilon

    def cost(self, delta: float) -> Cost:
        from dpcore.accounting import gdp
        from dpcore.accounting.composition import Cost
        from dpcore.accounting.orders import epsilon_from_rdp

        rdp = self.rdp()
        epsilon = epsilon_from_rdp(rdp, delta=delta)
        mu = self.mu
        if mu is not None:
            epsilon = min(epsilon, gdp.epsilon_of(mu, delta))
            return Cost(epsilon=epsilon, delta=delta, rdp=rdp, mu=mu)
        return Cost(epsilon=epsilon, delta=delta, rdp=rdp)

    def noise(self) -> NoiseDescription:
        return NoiseDescription.combine([s.noise() for s in self.steps], self.calibrated)

    def describe(self) -> dict[str, Any]:
        return {"composed": [step.describe() for step in self.steps]}
