"""Detail outside the basis: sampled rows given the energy the records have where the basis
does not reach.

A model fitted in the first k coordinates of a public basis B (d × k, orthonormal columns)
draws rows B·z with nothing in the d − k directions B leaves out, where the records do vary
(MNIST in its first 128 2-D DCT functions: 12.6 % of a unit row's energy lies outside them).
A linear model trained on such rows weighs those silent directions freely — after clipping into
the bounds they carry class-dependent patterns — and pays for it on real rows, which vary there.
One more noisy statistic restores their spread: every record's energy outside the basis,
e(u) = ‖u − B Bᵀu‖² = ‖u‖² − ‖Bᵀu‖², summed over the records, plus N(0, σ²).

Sensitivity (replace-one, n public): each computed term is clamped to [0, 1] (a unit row's
energy lies there: ‖u‖ ≤ 1 and B Bᵀ is an orthogonal projection), so two neighbours' sums
differ by at most ``SENSITIVITY`` = 1 in their computed terms, whatever the rounding inside a
term; every other term is the same computation on the same row. Attained by a record with
all its energy outside the basis replacing one inside it.

Post-processing (``Detail``): r̂ = clamp(noisy sum / n, 0, 1), the mean energy per record, and
every sampled row gets s·P⊥ε, ε ~ N(0, I_d) from the release's generator, P⊥ = I − B Bᵀ, with
s² = r̂/(d − k): isotropic within the left-out directions, with the records' mean energy there
in expectation. One scalar, so its noise costs little: σ = 25 at n = 10 000 moves r̂ by 0.0025.

Written by hand: one sum and one projection of Gaussian draws.
"""

from __future__ import annotations

import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.secure_random import SecureRandom

SENSITIVITY = 1.0
# Rows per pass when the energies are computed (memory ≈ chunk·d·8 bytes twice).
CHUNK = 2048


def energies(U: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """e(u) = ‖u‖² − ‖Bᵀu‖² (= ‖u − B Bᵀu‖², B's columns orthonormal) per unit row, from the
    rows ``U`` and their coefficients ``Z`` = BᵀU, float64, each clamped to [0, 1]."""
    parts = []
    for start in range(0, U.shape[0], CHUNK):
        rows = U[start : start + CHUNK].double().pow(2).sum(dim=1)
        inside = Z[start : start + CHUNK].double().pow(2).sum(dim=1)
        parts.append((rows - inside).clamp(0.0, 1.0))
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device=U.device)
    return torch.cat(parts)


def total(U: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """Σ e(u) over the records, as the (1, 1) row the noise sampler takes."""
    return energies(U, Z).sum().reshape(1, 1)


def rounding_error(n: int) -> float:
    """How far float64 rounding can move two neighbours' computed sums apart beyond the
    sensitivity: each sum of n terms in [0, 1] is off its exact value by ≤ γ_n·n."""
    return 2.0 * float_error.gamma(n, torch.float64) * n


class Detail:
    """The post-processing: rows (m, d) in the features gain s·P⊥ε (module docstring)."""

    def __init__(self, noisy_total: float, n: int, basis: Basis) -> None:
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
        if basis.matrix is None:
            raise ValueError("an identity basis leaves no direction out")
        d, k = basis.matrix.shape
        self.basis = basis
        self.energy = min(1.0, max(0.0, float(noisy_total) / n))
        self.scale = (self.energy / (d - k)) ** 0.5 if d > k else 0.0

    def __call__(self, rows: torch.Tensor, generator: SecureRandom) -> torch.Tensor:
        if self.scale == 0.0:
            return rows
        draws = generator.normal(tuple(rows.shape), dtype=torch.float64, device=rows.device)
        outside = draws - self.basis.lift(self.basis.project(draws), torch.float64)
        return rows.double() + self.scale * outside
