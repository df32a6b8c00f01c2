"""The one place release noise is drawn, so every mechanism uses the same samplers.

Two samplers, chosen per release (``noise_sampler``):

- ``secure`` (the default): values are rounded to the lattice gℤ (g a power of two) and
  g·K is added, K = round(N(0, σ'²)/g) drawn exactly from the OS CSPRNG
  (``dpcore.mechanisms.rounded_gaussian``, bits from the release's ``SecureRandom``). The
  output x_l + g·K = g·round((x_l + N)/g) is a post-processing of the Gaussian mechanism on
  x_l, whose sensitivity is Δ + e + g√d: Δ the accountant's, e the caller's bound on the
  floating-point error of the computed rows (``dpcore.mechanisms.float_error``), g√d the
  rounding (each of the d coordinates moves by at most g/2, on each side). σ' = σ·(1 + (e +
  g√d)/Δ) keeps the noise multiplier σ'/(Δ + e + g√d) = σ/Δ the accountant was given, so the
  charged ε stands unchanged.
  Outputs are exact multiples of g: their floating-point representation carries nothing about
  the input (the precision attacks of Mironov 2012 and Haney et al. 2022 need that it does).
- ``fast``: float N(0, σ²(1 + e/Δ)²) by Box–Muller from the release's ``SecureRandom``.
  Floating-point Gaussian sampling leaks through the low-order bits of the output; the
  release metadata says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms.rounded_gaussian import BLOCK, RoundedGaussian, table_size
from dpcore.mechanisms.rounded_gaussian import TAIL_SIGMAS as _TAIL_SIGMAS_OF_TABLE
from dpcore.mechanisms.secure_random import SecureRandom

# The rounding slack g√d/Δ stays within [MIN_SLACK, MAX_SLACK]: finer lattices cost a larger
# table, coarser ones add more noise. The build is now cheap (about 1 µs an entry, 0.12 s for
# 117 000), so the budget is set by memory and speed instead: a table of 2¹⁷ entries holds 2 MiB
# (entries and thresholds) plus its 3 MiB guide, and more entries would put more draws on the
# guide's slower path; at 2¹⁷ the walkthrough's slack (n = 60 000) is 0.24 %: kept.
MIN_SLACK = 2.0**-12
MAX_SLACK = 2.0**-6
TABLE_BUDGET = 1 << 17
TABLE_LIMIT = 1 << 20
# σ' is raised by a hair more than the slack so float rounding can only add noise.
_ROUNDING_MARGIN = 1e-12


class NoiseSampler(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(
        self, values: torch.Tensor, *, sigma: float, sensitivity: float, error: float = 0.0
    ) -> torch.Tensor:
        """``values`` plus Gaussian noise of std ``sigma`` per entry; ``sensitivity`` is the
        L2 sensitivity of each row of ``values`` that the accountant assumed, ``error`` a bound
        on how much further floating-point rounding can move two neighbours' computed rows
        apart (``dpcore.mechanisms.float_error``); the sampler raises its noise to cover it."""
        ...


def _covered(sigma: float, sensitivity: float, error: float) -> float:
    """σ·(1 + e/Δ): the same noise multiplier for the sensitivity Δ + e."""
    if not (math.isfinite(error) and 0 <= error < sensitivity):
        raise ValueError("the rounding error must be finite, non-negative and below Δ")
    return sigma * (1.0 + error / sensitivity)


def add_noise(values: torch.Tensor, sigma: float, source: SecureRandom) -> torch.Tensor:
    """``values`` + N(0, σ²) on every entry, from ``source`` on their device."""
    noise = source.normal(tuple(values.shape), device=values.device, dtype=torch.float64)
    return (values.double() + sigma * noise).to(values.dtype)


@dataclass
class FastNoise:
    """Float Gaussian noise from the secure source (not hardened against precision attacks)."""

    generator: SecureRandom
    name: str = "fast"

    def __call__(
        self, values: torch.Tensor, *, sigma: float, sensitivity: float, error: float = 0.0
    ) -> torch.Tensor:
        return add_noise(values, _covered(sigma, sensitivity, error), self.generator)


@dataclass(frozen=True)
class LatticePlan:
    """How the secure sampler adds noise of std ``sigma`` to rows of ``dim`` entries."""

    sigma: float
    sensitivity: float
    dim: int
    lattice: float  # g, a power of two
    sigma_effective: float  # σ' = σ·(1 + slack)
    error: float = 0.0  # e: the caller's floating-point error bound, beyond Δ

    @property
    def slack(self) -> float:
        """(e + g√d)/Δ: the relative sensitivity (and noise) increase rounding costs."""
        return (self.error + self.lattice * math.sqrt(self.dim)) / self.sensitivity

    @property
    def scale(self) -> float:
        """σ'/g: the noise std in lattice units."""
        return self.sigma_effective / self.lattice


def lattice_plan(*, sigma: float, sensitivity: float, dim: int, error: float = 0.0) -> LatticePlan:
    """The finest power-of-two lattice with lattice slack g√d/Δ ≤ MAX_SLACK whose table fits
    the budget (never finer than MIN_SLACK; coarser than MAX_SLACK only past TABLE_LIMIT);
    the rounding error ``error`` is added to Δ on top."""
    for value, what in ((sigma, "sigma"), (sensitivity, "sensitivity")):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what} must be finite and positive")
    if dim < 1:
        raise ValueError("dim must be at least 1")
    _covered(sigma, sensitivity, error)  # validates the error
    root = math.sqrt(dim)
    lattice = 2.0 ** math.floor(math.log2(MAX_SLACK * sensitivity / root))

    def plan(g: float) -> LatticePlan:
        slack = (error + g * root) / sensitivity
        raised = sigma * (1.0 + slack) * (1.0 + _ROUNDING_MARGIN)
        return LatticePlan(sigma, sensitivity, dim, g, raised, error)

    # Coarser lattices shrink the scale σ'/g only down to σ√d/Δ (the rounding slack grows
    # with g): past that, no lattice gives a table that can be built, and the loop below
    # would coarsen until g overflows. Refused in words instead (the job then ends failed,
    # refunded: nothing was released).
    if table_size(sigma * root / sensitivity) > TABLE_LIMIT // 2:
        raise ValueError(
            f"the secure sampler cannot draw noise σ = {sigma:g} at sensitivity "
            f"{sensitivity:g} over {dim} values (σ√d/Δ = {sigma * root / sensitivity:.4g}; "
            f"at most {TABLE_LIMIT // 2 / _TAIL_SIGMAS_OF_TABLE:.4g}): ask for less noise, or "
            "noise_sampler 'fast'"
        )
    best = plan(lattice)
    # Very large noise multipliers would need a table too slow to build: coarsen instead.
    while table_size(best.scale) > TABLE_LIMIT:
        best = plan(best.lattice * 2)
    while best.lattice * root / sensitivity / 2 >= MIN_SLACK:
        finer = plan(best.lattice / 2)
        if table_size(finer.scale) > TABLE_BUDGET:
            break
        best = finer
    return best


@dataclass
class SecureNoise:
    """Lattice rounding plus exact rounded-Gaussian noise from the secure source (the
    release's ``SecureRandom``; the OS CSPRNG directly when none is given)."""

    source: SecureRandom | None = None
    name: str = "secure"
    plans: dict[tuple[float, float, int, float], LatticePlan] = field(default_factory=dict)

    def plan(
        self, *, sigma: float, sensitivity: float, dim: int, error: float = 0.0
    ) -> LatticePlan:
        key = (float(sigma), float(sensitivity), int(dim), float(error))
        if key not in self.plans:
            self.plans[key] = lattice_plan(
                sigma=sigma, sensitivity=sensitivity, dim=dim, error=error
            )
        return self.plans[key]

    def __call__(
        self, values: torch.Tensor, *, sigma: float, sensitivity: float, error: float = 0.0
    ) -> torch.Tensor:
        dim = int(values.shape[-1]) if values.ndim else 1
        plan = self.plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error)
        sampler = RoundedGaussian(plan.scale)
        cpu = values.detach().to(device="cpu")
        if cpu.dtype not in (torch.float32, torch.float64):
            cpu = cpu.to(torch.float64)
        rows = cpu.contiguous().numpy().reshape(-1)
        noisy = np.empty_like(rows)
        random_bytes = self.source.bytes if self.source is not None else os.urandom
        # In blocks, so the float64 work and the draws stay in the CPU's cache; each block
        # reads its draws' words (8 bytes each) then the rare extra words, in order.
        work = np.empty(min(BLOCK, rows.size), dtype=np.float64)
        for at in range(0, rows.size, BLOCK):
            x = work[: min(BLOCK, rows.size - at)]
            # Float32 → float64 is exact: the rows rounded are the rows the error bound is
            # about. Division by a power of two is exact; rint is a deterministic rounding.
            x[...] = rows[at : at + x.size]
            np.divide(x, plan.lattice, out=x)
            np.rint(x, out=x)
            if self.source is not None:
                words = self.source.words(x.size)
            else:
                words = np.frombuffer(os.urandom(8 * x.size), dtype="<u8").astype(np.uint64)
            x += sampler.draw(words, random_bytes)
            # Beyond 2⁵³ float64 would round lattice points (and NaN fails both).
            if not (x.max() < 2.0**53 and x.min() > -(2.0**53)):
                raise OverflowError("values too large for the lattice")
            x *= plan.lattice
            noisy[at : at + x.size] = x
        out = torch.from_numpy(noisy.reshape(tuple(values.shape)))
        return out.to(dtype=values.dtype, device=values.device)

    def describe(self) -> list[dict[str, float]]:
        return [
            {
                "sigma": p.sigma,
                "sensitivity": p.sensitivity,
                "rounding_error": p.error,
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

    def __call__(
        self, values: torch.Tensor, *, sigma: float, sensitivity: float, error: float = 0.0
    ) -> torch.Tensor:
        scale = self.scale_for(sigma=sigma, sensitivity=sensitivity)
        return self.inner(values, sigma=scale.sigma, sensitivity=scale.sensitivity, error=error)

    def describe(self) -> list[dict[str, float]] | None:
        describe = getattr(self.inner, "describe", None)
        return describe() if callable(describe) else None


def sampler(name: str, generator: SecureRandom) -> NoiseSampler:
    """The named sampler drawing from ``generator`` (the release's one secure source)."""
    if name == "secure":
        return SecureNoise(generator)
    if name == "fast":
        return FastNoise(generator)
    raise ValueError(f"unknown noise sampler {name!r}")
