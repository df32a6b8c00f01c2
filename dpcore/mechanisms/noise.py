"""The one place release noise is drawn, so every mechanism uses the same samplers.

Two samplers, chosen per release (``noise_sampler``):

- ``secure`` (the default): values are rounded to the lattice gℤ (g a power of two) and
  g·K is added, K = round(N(0, σ'²)/g) drawn exactly from the OS CSPRNG
  (``dpcore.mechanisms.rounded_gaussian``). The output x_l + g·K = g·round((x_l + N)/g) is a
  post-processing of the Gaussian mechanism on x_l, whose sensitivity is Δ + g√d (rounding
  moves each of the d coordinates by at most g/2). σ' = σ·(1 + g√d/Δ) keeps the noise
  multiplier σ'/(Δ + g√d) = σ/Δ the accountant was given, so the charged ε stands unchanged.
  Outputs are exact multiples of g: their floating-point representation carries nothing about
  the input (the precision attacks of Mironov 2012 and Haney et al. 2022 need that it does).
- ``fast``: torch's generator (seeded from ``secrets``) adds float N(0, σ²). Floating-point
  Gaussian sampling leaks through the low-order bits of the output; the release metadata
  says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms.rounded_gaussian import RoundedGaussian, table_size

# The rounding slack g√d/Δ stays within [MIN_SLACK, MAX_SLACK]: finer lattices cost a larger
# table (built once per noise level, about 20 µs an entry), coarser ones add more noise.
MIN_SLACK = 2.0**-12
MAX_SLACK = 2.0**-6
TABLE_BUDGET = 1 << 17
TABLE_LIMIT = 1 << 20
# σ' is raised by a hair more than the slack so float rounding can only add noise.
_ROUNDING_MARGIN = 1e-12


class NoiseSampler(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, values: torch.Tensor, *, sigma: float, sensitivity: float) -> torch.Tensor:
        """``values`` plus Gaussian noise of std ``sigma`` per entry; ``sensitivity`` is the
        L2 sensitivity of each row of ``values`` that the accountant assumed."""
        ...


def add_noise(values: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """``values`` + N(0, σ²) on every entry, drawn from ``generator`` on their device."""
    noise = torch.randn(values.shape, generator=generator, device=values.device, dtype=values.dtype)
    return values + sigma * noise


@dataclass
class FastNoise:
    """Float Gaussian noise from a torch generator (not hardened against precision attacks)."""

    generator: torch.Generator
    name: str = "fast"

    def __call__(self, values: torch.Tensor, *, sigma: float, sensitivity: float) -> torch.Tensor:
        return add_noise(values, sigma, self.generator)


@dataclass(frozen=True)
class LatticePlan:
    """How the secure sampler adds noise of std ``sigma`` to rows of ``dim`` entries."""

    sigma: float
    sensitivity: float
    dim: int
    lattice: float  # g, a power of two
    sigma_effective: float  # σ' = σ·(1 + slack)

    @property
    def slack(self) -> float:
        """g√d/Δ: the relative sensitivity (and noise) increase the rounding costs."""
        return self.lattice * math.sqrt(self.dim) / self.sensitivity

    @property
    def scale(self) -> float:
        """σ'/g: the noise std in lattice units."""
        return self.sigma_effective / self.lattice


def lattice_plan(*, sigma: float, sensitivity: float, dim: int) -> LatticePlan:
    """The finest power-of-two lattice with slack ≤ MAX_SLACK whose table fits the budget
    (never finer than MIN_SLACK; coarser than MAX_SLACK only past TABLE_LIMIT)."""
    for value, what in ((sigma, "sigma"), (sensitivity, "sensitivity")):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what} must be finite and positive")
    if dim < 1:
        raise ValueError("dim must be at least 1")
    root = math.sqrt(dim)
    lattice = 2.0 ** math.floor(math.log2(MAX_SLACK * sensitivity / root))

    def plan(g: float) -> LatticePlan:
        raised = sigma * (1.0 + g * root / sensitivity) * (1.0 + _ROUNDING_MARGIN)
        return LatticePlan(sigma, sensitivity, dim, g, raised)

    best = plan(lattice)
    # Very large noise multipliers would need a table too slow to build: coarsen instead.
    while table_size(best.scale) > TABLE_LIMIT:
        best = plan(best.lattice * 2)
    while best.slack / 2 >= MIN_SLACK:
        finer = plan(best.lattice / 2)
        if table_size(finer.scale) > TABLE_BUDGET:
            break
        best = finer
    return best


@dataclass
class SecureNoise:
    """Lattice rounding plus exact rounded-Gaussian noise from the OS CSPRNG."""

    name: str = "secure"
    plans: dict[tuple[float, float, int], LatticePlan] = field(default_factory=dict)

    def plan(self, *, sigma: float, sensitivity: float, dim: int) -> LatticePlan:
        key = (float(sigma), float(sensitivity), int(dim))
        if key not in self.plans:
            self.plans[key] = lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim)
        return self.plans[key]

    def __call__(self, values: torch.Tensor, *, sigma: float, sensitivity: float) -> torch.Tensor:
        dim = int(values.shape[-1]) if values.ndim else 1
        plan = self.plan(sigma=sigma, sensitivity=sensitivity, dim=dim)
        exact = values.detach().to(device="cpu", dtype=torch.float64).numpy()
        # Division by a power of two is exact; rint is a deterministic rounding to gℤ.
        steps = np.rint(exact / plan.lattice)
        draws = RoundedGaussian(plan.scale).sample(exact.size).reshape(exact.shape)
        total = steps + draws
        if not np.all(np.abs(total) < 2.0**53):  # beyond it, float64 would round lattice points
            raise OverflowError("values too large for the lattice")
        noisy = total * plan.lattice
        return torch.as_tensor(noisy, dtype=values.dtype, device=values.device)

    def describe(self) -> list[dict[str, float]]:
        return [
            {
                "sigma": p.sigma,
                "sensitivity": p.sensitivity,
                "dim": p.dim,
                "lattice": p.lattice,
                "slack": p.slack,
                "sigma_effective": p.sigma_effective,
            }
            for p in self.plans.values()
        ]


class UndeclaredNoise(ValueError):
    """A generator asked for noise its release's accountant did not declare."""


# Declared and requested scales are computed by the same formulas, possibly in another order:
# they agree to a few ulps.
_MATCH_RTOL = 1e-9


@dataclass
class DeclaredNoise:
    """A sampler that adds only the noise a release's accountant declared.

    Each call must name a declared scale's σ and a sensitivity no larger than the declared one
    (the generator computes it from the same accountant); the inner sampler then plans and
    draws with the declared values, so the noise is what was charged and nothing else."""

    inner: NoiseSampler
    declared: NoiseDescription

    @property
    def name(self) -> str:
        return self.inner.name

    def scale_for(self, *, sigma: float, sensitivity: float) -> NoiseScale:
        for scale in self.declared.scales:
            if math.isclose(sigma, scale.sigma, rel_tol=_MATCH_RTOL) and sensitivity <= (
                scale.sensitivity * (1 + _MATCH_RTOL)
            ):
                return scale
        declared = ", ".join(
            f"{s.name} (σ={s.sigma:g}, sensitivity {s.sensitivity:g})" for s in self.declared.scales
        )
        raise UndeclaredNoise(
            f"noise σ={sigma:g} with sensitivity {sensitivity:g} is not declared by the "
            f"accountant; declared: {declared}"
        )

    def __call__(self, values: torch.Tensor, *, sigma: float, sensitivity: float) -> torch.Tensor:
        scale = self.scale_for(sigma=sigma, sensitivity=sensitivity)
        return self.inner(values, sigma=scale.sigma, sensitivity=scale.sensitivity)

    def describe(self) -> list[dict[str, float]] | None:
        describe = getattr(self.inner, "describe", None)
        return describe() if callable(describe) else None


def sampler(name: str, generator: torch.Generator) -> NoiseSampler:
    if name == "secure":
        return SecureNoise()
    if name == "fast":
        return FastNoise(generator)
    raise ValueError(f"unknown noise sampler {name!r}")
