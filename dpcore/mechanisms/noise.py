"""The one place release noise is drawn, so every mechanism uses the same samplers.

Two samplers, chosen per release (``noise_sampler``):

- ``secure`` (the default): values are rounded to the lattice gℤ (g a power of two) and
  g·K is added, K = round(N(0, σ'²)/g) drawn exactly from the OS CSPRNG
  (``dpcore.mechanisms.rounded_gaussian``, bits from the release's ``SecureRandom``). The
  output x_l + g·K = g·round((x_l + N)/g) is a post-processing of the Gaussian mechanism on
  x_l. Rounding (each of the d coordinates moves by at most g/2) and the floating-point error
  e of the computed rows (``dpcore.mechanisms.float_error``) move every distance between the
  rows the analysis compares by at most b = e + g√d. The step's analysis is stated for such
  distances of at least a unit u — its ``unit``: Δ for a Gaussian query, one record's
  contribution radius for a Poisson-subsampled sum (dp_accounting's convention, whose replace-
  one Δ is twice it), the smallest row move of a composite worst case. σ' = σ·(1 + b/u)
  scales every distance a by at most (a + b)/a ≤ 1 + b/u, so the rounded rows in units of σ'
  are rows the analysis covers in units of σ, and the charged ε stands unchanged.
  Outputs are exact multiples of g: their floating-point representation carries nothing about
  the input (the precision attacks of Mironov 2012 and Haney et al. 2022 need that it does).
- ``fast``: float N(0, σ²(1 + e/u)²) by Box–Muller from the release's ``SecureRandom``.
  Floating-point Gaussian sampling leaks through the low-order bits of the output; the
  release metadata says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms import device_draws
from dpcore.mechanisms.rounded_gaussian import (
    BLOCK,
    SCALE_LIMIT,
    TABLE_ENTRIES,
    RoundedGaussian,
    table_size,
)
from dpcore.mechanisms.secure_random import SecureRandom

# The rounding slack g√d/u stays within [MIN_SLACK, MAX_SLACK]: finer lattices cost a larger
# scale σ'/g. While a table of every entry holds it (TABLE_LIMIT), the draws use one — refined
# only while it stays within TABLE_BUDGET entries (2 MiB with its 3 MiB guide; more entries put
# more draws on the guide's slower path). Past TABLE_LIMIT the table-free draw, whose memory
# and speed do not depend on the scale (several times slower than a table), takes the finest
# lattice (a coarser one would add noise).
MIN_SLACK = 2.0**-12
MAX_SLACK = 2.0**-6
TABLE_BUDGET = 1 << 17
TABLE_LIMIT = TABLE_ENTRIES
# σ' is raised by a hair more than the slack so float rounding can only add noise.
_ROUNDING_MARGIN = 1e-12


class NoiseSampler(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        """``values`` plus Gaussian noise of std ``sigma`` per entry; ``sensitivity`` is the
        L2 sensitivity of each row of ``values`` that the accountant assumed, ``error`` a bound
        on how much further floating-point rounding can move two neighbours' computed rows
        apart (``dpcore.mechanisms.float_error``), and ``unit`` (≤ ``sensitivity``; None:
        ``sensitivity`` itself) the smallest row distance the step's analysis is stated for
        (module docstring): the sampler raises its noise by (error + rounding)/unit."""
        ...


def cover_unit(sensitivity: float, unit: float | None) -> float:
    """The unit a cover is relative to: ``unit``, or Δ for a plain Gaussian query."""
    if unit is None:
        return sensitivity
    if not (math.isfinite(unit) and 0 < unit <= sensitivity * (1 + 1e-12)):
        raise ValueError(f"the cover unit must be in (0, sensitivity], got {unit}")
    return float(unit)


def _covered(sigma: float, unit: float, error: float) -> float:
    """σ·(1 + e/u): the same noise multiplier for every distance a ≥ u moved by e."""
    if not (math.isfinite(error) and 0 <= error < unit):
        raise ValueError("the rounding error must be finite, non-negative and below the unit")
    return sigma * (1.0 + error / unit)


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
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        covered = _covered(sigma, cover_unit(sensitivity, unit), error)
        return add_noise(values, covered, self.generator)

    def tail(
        self,
        *,
        sigma: float,
        sensitivity: float,
        dim: int,
        error: float = 0.0,
        unit: float | None = None,
    ) -> tuple[float, float]:
        """(s, b): the noise this call would add is N(0, s²) exactly, so b = 0 (``tail``)."""
        return _covered(sigma, cover_unit(sensitivity, unit), error), 0.0


@dataclass(frozen=True)
class LatticePlan:
    """How the secure sampler adds noise of std ``sigma`` to rows of ``dim`` entries."""

    sigma: float
    sensitivity: float
    dim: int
    lattice: float  # g, a power of two
    sigma_effective: float  # σ' = σ·(1 + slack)
    error: float = 0.0  # e: the caller's floating-point error bound, beyond Δ
    unit: float = 0.0  # u: the distance the cover is relative to (0: the sensitivity)

    @property
    def cover_unit(self) -> float:
        return self.unit or self.sensitivity

    @property
    def slack(self) -> float:
        """(e + g√d)/u: the relative distance (and noise) increase rounding costs."""
        return (self.error + self.lattice * math.sqrt(self.dim)) / self.cover_unit

    @property
    def scale(self) -> float:
        """σ'/g: the noise std in lattice units."""
        return self.sigma_effective / self.lattice

    @property
    def tabled(self) -> bool:
        """Whether the draws use a table of every entry (else the table-free path)."""
        return table_size(self.scale) <= TABLE_LIMIT


def lattice_plan(
    *, sigma: float, sensitivity: float, dim: int, error: float = 0.0, unit: float | None = None
) -> LatticePlan:
    """The power-of-two lattice with rounding slack g√d/u ≤ MAX_SLACK, refined towards
    MIN_SLACK while its table fits the budget — to MIN_SLACK directly when even that lattice
    needs more than a table holds (the table-free draw costs the same at every scale); the
    float error ``error`` is added to the rounding. ``unit``: see ``NoiseSampler``."""
    for value, what in ((sigma, "sigma"), (sensitivity, "sensitivity")):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what} must be finite and positive")
    if dim < 1:
        raise ValueError("dim must be at least 1")
    u = cover_unit(sensitivity, unit)
    _covered(sigma, u, error)  # validates the error
    root = math.sqrt(dim)
    stored_unit = 0.0 if unit is None else u

    def plan(g: float) -> LatticePlan:
        slack = (error + g * root) / u
        raised = sigma * (1.0 + slack) * (1.0 + _ROUNDING_MARGIN)
        return LatticePlan(sigma, sensitivity, dim, g, raised, error, stored_unit)

    best = plan(2.0 ** math.floor(math.log2(MAX_SLACK * u / root)))
    tabled = best.tabled
    while best.lattice * root / u / 2 >= MIN_SLACK:
        finer = plan(best.lattice / 2)
        if tabled and table_size(finer.scale) > TABLE_BUDGET:
            break
        best = finer
    if table_size(best.scale) > SCALE_LIMIT:
        raise ValueError(
            f"the secure sampler cannot draw noise σ = {sigma:g} over {dim} values at unit "
            f"{u:g} (σ√d/u = {sigma * root / u:.4g}): ask for less noise, or noise_sampler 'fast'"
        )
    return best


# The smallest cover unit any draw uses, relative to its scale's sensitivity: a call's unit is
# the contribution it is analysed for (half the replace-one sensitivity of a subsampled sum,
# ClustMix paper's smaller row move), never less than a quarter of it.
MIN_UNIT_SHARE = 0.25


def check_drawable(*, sigma: float, sensitivity: float, width: int) -> None:
    """Raise ``ValueError`` (``lattice_plan``'s) unless the secure sampler draws noise of std
    ``sigma`` for any call of this scale over at most ``width`` values: admission's check, in
    the worst case — the smallest unit (``MIN_UNIT_SHARE``) and a rounding error up to the
    unit, which raises σ' by less than a factor 2 (the finest lattice, where the limit is
    reached, does not depend on σ)."""
    lattice_plan(
        sigma=2.0 * sigma,
        sensitivity=sensitivity,
        dim=max(1, width),
        unit=sensitivity * MIN_UNIT_SHARE,
    )


@dataclass
class SecureNoise:
    """Lattice rounding plus exact rounded-Gaussian noise from the secure source (the
    release's ``SecureRandom``; the OS CSPRNG directly when none is given)."""

    source: SecureRandom | None = None
    name: str = "secure"
    plans: dict[tuple[float, float, int, float, float], LatticePlan] = field(default_factory=dict)
    # Values on a device other than the CPU are noised there (``device_draws``: the same stream
    # and values); True takes that path on the CPU too (tests: the CUDA path's code).
    on_device: bool = False

    def plan(
        self,
        *,
        sigma: float,
        sensitivity: float,
        dim: int,
        error: float = 0.0,
        unit: float | None = None,
    ) -> LatticePlan:
        key = (float(sigma), float(sensitivity), int(dim), float(error), float(unit or 0.0))
        if key not in self.plans:
            self.plans[key] = lattice_plan(
                sigma=sigma, sensitivity=sensitivity, dim=dim, error=error, unit=unit
            )
        return self.plans[key]

    def tail(
        self,
        *,
        sigma: float,
        sensitivity: float,
        dim: int,
        error: float = 0.0,
        unit: float | None = None,
    ) -> tuple[float, float]:
        """(s, b) for this call's rows (``tail``): the value rounded to the lattice g (moved
        by ≤ g/2) plus g·round(Z/g), Z ~ N(0, σ'²): the noise lies within Z ± g, so s = σ'
        and b = g."""
        plan = self.plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error, unit=unit)
        return plan.sigma_effective, plan.lattice

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        dim = int(values.shape[-1]) if values.ndim else 1
        plan = self.plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error, unit=unit)
        sampler = RoundedGaussian(plan.scale)
        if (
            self.source is not None
            and sampler.tabled
            and (self.on_device or values.device.type != "cpu")
        ):
            flat = values.detach().reshape(-1).to(torch.float64)
            noisy_rows = device_draws.lattice_noise(flat, plan.lattice, sampler, self.source)
            return noisy_rows.reshape(values.shape).to(values.dtype)
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
            np.divide(rows[at : at + x.size], plan.lattice, out=x, dtype=np.float64)
            np.rint(x, out=x)
            if self.source is not None:
                words = self.source.words(x.size)
            else:
                words = np.frombuffer(os.urandom(8 * x.size), dtype="<u8").astype(np.uint64)
            x += sampler.draw(words, random_bytes)
            # Beyond 2⁵³ float64 would round lattice points (and NaN fails both).
            if not (x.max() < 2.0**53 and x.min() > -(2.0**53)):
                raise OverflowError("values too large for the lattice")
            # The product is exact in float64 (a power of two), rounded once into ``noisy``.
            np.multiply(x, plan.lattice, out=noisy[at : at + x.size], casting="same_kind")
        out = torch.from_numpy(noisy.reshape(tuple(values.shape)))
        return out.to(dtype=values.dtype, device=values.device)

    def describe(self) -> list[dict[str, float]]:
        return [
            {
                "sigma": p.sigma,
                "sensitivity": p.sensitivity,
                "cover_unit": p.cover_unit,
                "rounding_error": p.error,
                "dim": p.dim,
                "lattice": p.lattice,
                "slack": p.slack,
                "sigma_effective": p.sigma_effective,
                "table_free": not p.tabled,
            }
            for p in self.plans.values()
        ]


def tail(
    sampler: NoiseSampler,
    *,
    sigma: float,
    sensitivity: float,
    dim: int,
    error: float = 0.0,
    unit: float | None = None,
) -> tuple[float, float]:
    """(s, b) such that the noise ``sampler`` adds to each entry of a row of ``dim`` entries,
    called with these arguments, lies within b of an N(0, s²) variable: a tail bound on the
    noise is the Gaussian's at s, widened by b. The served samplers say it (the `secure`
    sampler's effective σ and lattice); a sampler that does not is taken to draw N(0, σ²)
    exactly (test doubles)."""
    own = getattr(sampler, "tail", None)
    if own is None:
        return float(sigma), 0.0
    spread, offset = own(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error, unit=unit)
    return float(spread), float(offset)


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
    draws with the declared values, so the noise is what was charged and nothing else. A scale
    declared ``at_least`` takes any σ at or above its own (the accountant bounds the run
    whatever the mechanism picks): the call's σ is drawn."""

    inner: NoiseSampler
    declared: NoiseDescription

    @property
    def name(self) -> str:
        return self.inner.name

    def scale_for(self, *, sigma: float, sensitivity: float) -> NoiseScale:
        for scale in self.declared.scales:
            if sensitivity > scale.sensitivity * (1 + _MATCH_RTOL):
                continue
            # An at-least scale draws the call's σ whenever it is not below its own, even
            # within the match tolerance: the mechanism is charged for the σ it asked for.
            if scale.at_least and sigma >= scale.sigma:
                return replace(scale, sigma=sigma)
            if math.isclose(sigma, scale.sigma, rel_tol=_MATCH_RTOL):
                return scale
        declared = ", ".join(
            f"{s.name} (σ={s.sigma:g}, sensitivity {s.sensitivity:g})" for s in self.declared.scales
        )
        raise UndeclaredNoise(
            f"noise σ={sigma:g} with sensitivity {sensitivity:g} is not declared by the "
            f"accountant; declared: {declared}"
        )

    def tail(
        self,
        *,
        sigma: float,
        sensitivity: float,
        dim: int,
        error: float = 0.0,
        unit: float | None = None,
    ) -> tuple[float, float]:
        """The inner sampler's (s, b) for the call ``__call__`` would make (``tail``)."""
        return tail(self.inner, dim=dim, error=error, **self._inner(sigma, sensitivity, unit))

    def _inner(self, sigma: float, sensitivity: float, unit: float | None) -> dict[str, float]:
        """The inner sampler's σ, sensitivity and cover unit for a call: the declared scale's
        values; the cover stays relative to the call's own analysis — its unit (a
        contribution radius), else its row's sensitivity, which may be below the declared
        maximum (a count row under a scale that also noises sums): a smaller unit only raises
        it."""
        scale = self.scale_for(sigma=sigma, sensitivity=sensitivity)
        return {
            "sigma": scale.sigma,
            "sensitivity": scale.sensitivity,
            "unit": min(cover_unit(sensitivity, unit), scale.sensitivity),
        }

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        return self.inner(values, error=error, **self._inner(sigma, sensitivity, unit))

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
