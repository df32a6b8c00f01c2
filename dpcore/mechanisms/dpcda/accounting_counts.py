"""DP-CDA with class sizes under DP (``class_sizes: "dp"``): no assumption on the datasets.

Mechanism. Y: the K class counts plus N(0, σ_c² I) (σ_c = ``count_noise``; replace-one moves
two counts by 1, so Y is μ_c = √2/σ_c-GDP; K = 1: n is public, nothing moves). From Y the
lower bounds m̂_c = ⌊Y_c − s·Φ⁻¹(1 − β/K) − b⌋ (β = ``class_size_failure_prob``; s, b the
sampler's ``noise.tail``: σ_c and 0 for a Gaussian, the effective σ' and the lattice step for
the `secure` sampler): with probability ≥ 1 − β every m̂_c ≤ N_c (a union bound over K tails). Z: if
min_c m̂_c ≥ m (``min_class_size``, public, ≥ ℓ) the mixtures of ``accounting_mixing`` at the σ
fixed at admission; otherwise rows of noise alone (⊥; same shapes). Published: Y, m̂, Z.

Analysis. Let M̃ be M with the mixing replaced by a padded mixing: a class with N_c < m is
topped up with m − N_c zero records (analysis only; zero is a valid preprocessed record,
within R of every record). M and M̃ differ only when some m̂_c > N_c (then min m̂ ≥ m > N_c
is possible): on every dataset their output laws are within total variation β.
M̃ is valid on every pair of replace-one neighbours, with no restriction on class sizes:
- Y is the Gaussian mechanism (μ_c); the choice between ⊥ and the mixing is a function of Y,
  and ⊥ is dominated by any pair, so by adaptive composition (Dong–Roth–Su 2022 Thm 3.2;
  Zhu–Dong–Wang 2022) M̃ is dominated by G_{μ_c} ⊗ (the mixing's pair).
- The padded mixing samples every class from max(N_c, m) ≥ m records: p ≤ ℓ/m. A record
  staying in its class: replace-one within it, the symmetric WOR pair ω* at p (``pld``).
  A record moving from class a to b: class a either loses it (N_a > m: the pair (M, N₀)) or
  has it replaced by a padding zero (N_a ≤ m: ω*); class b likewise gains one ((N₀, M)) or
  has a zero replaced (ω*). ω* = min{f_p, f_p⁻¹}** dominates both one-sided pairs
  (f_p = T(N₀, M), f_p⁻¹ = T(M, N₀)), and the classes are independent, so every case is
  within ω*^{⊗2T_c} (ω*^{⊗T_c} when K = 1: no class to move to).
So M̃ is (ε, δ̃(ε))-DP with δ̃ the PLD of G_{μ_c} ⊗ ω*^{⊗2T_c} (DP standardisation statistics,
when used, are one more Gaussian: μ² adds). For any event S, with TV ≤ β on both datasets,
P[M(D) ∈ S] ≤ P[M̃(D) ∈ S] + β ≤ e^ε·P[M̃(D′) ∈ S] + δ̃ + β ≤ e^ε·P[M(D′) ∈ S] + δ̃ +
(1 + e^ε)·β. ε at δ: with ε̄ = ε̃(δ/2) (the PLD's ε at δ/2) and (1 + e^ε̄)·β ≤ δ/2, the
answer is ε̃(δ − (1 + e^ε̄)·β) ≤ ε̄, valid since e^ε ≤ e^ε̄ there.

The charge is fixed at admission: σ (features) is calibrated for the target with m, σ_c
and β as given (or, left out, chosen for the target by ``accounting.prepare``); the job never
changes it. The RDP curve is not on the cost: β is an additive
δ no Rényi curve carries, so the ledger composes this entry by its (ε, δ).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import special

from dpcore.accounting.composition import Cost
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.accounting.pld import (
    compose,
    default_interval,
    epsilon_for_delta,
    mixture_pmf,
    tail_level,
)
from dpcore.mechanisms.dpcda.accounting_mixing import DPCDAEvent, statistics_step

#: L2 sensitivity of the K counts under replace-one (one count −1, another +1).
COUNT_SENSITIVITY = math.sqrt(2.0)


def bound_margin(count_noise: float, failure_prob: float, classes: int) -> float:
    """σ_c·Φ⁻¹(1 − β/K): how far below its noisy count a class's DP lower bound sits."""
    return count_noise * float(-special.ndtri(failure_prob / classes))


def lower_bounds(
    noisy_counts: np.ndarray, count_noise: float, failure_prob: float, offset: float = 0.0
) -> np.ndarray:
    """m̂_c = ⌊Y_c − s·Φ⁻¹(1 − β/K) − b⌋: all ≤ the true counts with probability ≥ 1 − β when
    every count's noise lies within b of an N(0, s²) variable (s = ``count_noise``, b =
    ``offset``: the sampler's ``noise.tail``; the `secure` sampler's effective σ' ≥ σ_c and
    its lattice step, so the bound holds for the noise drawn, not only for σ_c)."""
    margin = bound_margin(count_noise, failure_prob, len(noisy_counts)) + offset
    return np.floor(np.asarray(noisy_counts, dtype=np.float64) - margin).astype(np.int64)


@dataclass(frozen=True)
class DPCountsMixing:
    """The mixing step's parameters (``accounting_mixing.DPCDAEvent``'s) with DP class sizes, and
    the Gaussian steps composed before it (counts; standardisation statistics if any)."""

    n: int
    mixture_degree: int
    n_samples: int
    clip_norm: float
    n_classes: int
    min_class_size: int
    sigma: float
    nonnegative: bool
    count_noise: float
    failure_prob: float
    # The DP standardisation statistics' σ and sensitivity √(2d), when estimated under DP.
    stats_noise: float | None = None
    stats_sensitivity: float | None = None

    def __post_init__(self) -> None:
        DPCDAEvent(*self._mixing_args())  # validates the shared fields
        for name in ("count_noise", "failure_prob"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if (self.stats_noise is None) != (self.stats_sensitivity is None):
            raise ValueError("stats_noise and stats_sensitivity go together")

    def _mixing_args(self) -> tuple[Any, ...]:
        return (
            operator.index(self.n),
            operator.index(self.mixture_degree),
            operator.index(self.n_samples),
            self.clip_norm,
            operator.index(self.n_classes),
            operator.index(self.min_class_size),
            self.sigma,
            self.nonnegative,
        )

    @property
    def mixing(self) -> DPCDAEvent:
        return DPCDAEvent(*self._mixing_args())

    @property
    def gaussian_mu(self) -> float:
        """μ of the Gaussian steps before the mixing (counts, statistics), composed."""
        mu2 = (COUNT_SENSITIVITY / self.count_noise) ** 2
        if self.stats_noise is not None and self.stats_sensitivity is not None:
            mu2 += (self.stats_sensitivity / self.stats_noise) ** 2
        return math.sqrt(mu2)

    @property
    def mixing_steps(self) -> int:
        """2·T_c copies of ω* (T_c when K = 1)."""
        per = self.mixing.mixtures_per_class
        return per if self.n_classes == 1 else 2 * per

    def epsilon(self, delta: float) -> float:
        return _epsilon(self, float(delta))

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta)

    def noise(self) -> NoiseDescription:
        scales = []
        if self.stats_noise is not None and self.stats_sensitivity is not None:
            scales.append(
                statistics_step(
                    stats_noise=self.stats_noise,
                    n_features=round(self.stats_sensitivity**2 / 2),
                ).scale
            )
        scales.append(
            NoiseScale(
                "counts",
                self.count_noise,
                COUNT_SENSITIVITY,
                ("counts",),
                "per-class record counts (DP lower bounds on the class sizes)",
            )
        )
        scales.extend(self.mixing.noise().scales)
        return NoiseDescription(
            scales=tuple(scales),
            calibrated="features",
            # Both chosen for the target when the request left them out (``prepare``): the
            # parameters stored with the release carry them, and the job reads them back.
            analysis={
                "class_size_failure_prob": self.failure_prob,
                "count_noise": self.count_noise,
            },
        )

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "dpcda",
            "accountant": "tight",
            "class_sizes": "dp",
            "epsilon": "PLD of G(μ) ⊗ ω*^(2·T_c), δ + (1 + e^ε)·β",
            "gaussian_mu": self.gaussian_mu,
            "sampling_prob": self.mixing.sampling_prob,
            "noise_multiplier": self.mixing.noise_multiplier,
            **asdict(self),
        }


@functools.lru_cache(maxsize=1024)
def _epsilon(event: DPCountsMixing, delta: float) -> float:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    mixing = event.mixing
    p, z, T = mixing.sampling_prob, mixing.noise_multiplier, event.mixing_steps
    tail = tail_level(delta, T)
    h = default_interval(p, z, tail)
    mixing_pld = compose(mixture_pmf(p, z, h, tail), T)
    if mixing_pld.get_delta_for_epsilon(1e300) >= 1.0:
        return math.inf  # all mass at +∞ (a mixture's loss past MAX_LOSS): no finite ε
    composed = mixing_pld.compose(
        # The Gaussian pair is the WOR pair at p = 1 (no atom): exact up to the grid.
        mixture_pmf(1.0, 1.0 / event.gaussian_mu, h, tail).pld()
    )
    cap = float(epsilon_for_delta(composed, delta / 2))
    if cap != cap:
        return math.inf  # extreme noise: no PLD bound (NaN)
    spent = (1 + math.exp(min(cap, 700.0))) * event.failure_prob
    if not spent <= delta / 2:
        return math.inf  # β is too large for this δ: no finite ε by this argument
    return float(epsilon_for_delta(composed, delta - spent))
