"""DP-CDA accountants: class-centric mixing ("DP-CDA: … Dataset Synthesis Through Randomized
Mixing").

Mechanism. Features are standardised, then every record is clipped to ‖x‖ ≤ C =
``clip_norm``. There are K = ``n_classes`` classes; for each class c the mechanism releases
T_c = ⌈T/K⌉ mixtures (T = ``n_samples``), each the mean of ℓ = ``mixture_degree`` distinct
records of class c drawn uniformly without replacement (independently per mixture), plus
N(0, σ² I) on the features. σ is that feature noise std. The label of a class-c mixture is c
itself, a function of the public class index and of the output's position, so it carries no
information about the records and needs no noise. Class sizes are private; m =
``min_class_size`` (≥ ℓ) is a public lower bound on every class's size, in both neighbours.
The standardisation uses public (declared) statistics, or statistics estimated under DP
(``statistics_step``) whose cost composes with the mixtures'; exact statistics of the private
data would change every record when one is replaced and are not covered.

Sensitivity of one mixture mean when one member of the ℓ-subset is replaced: ‖x − x′‖/ℓ ≤
R/ℓ, R the largest distance between two preprocessed records
(``dpcore.mechanisms.class_mixing.record_distance``):
- ``unit_range`` (the default): every feature is clipped to its declared [lo, hi] and mapped
  to [0, 1], then the row is scaled down to ‖x‖ ≤ C. Every coordinate is ≥ 0 (below), so
  ⟨x, x′⟩ ≥ 0 and ‖x − x′‖² = ‖x‖² + ‖x′‖² − 2⟨x, x′⟩ ≤ 2C²: R = √2·C, attained by two
  orthogonal records of norm C (e.g. (C, 0, …) and (0, C, …)).
  Non-negativity in floating point: after np.clip, x ≥ lo holds exactly, so the rounded
  difference x − lo is ≥ 0 (rounding is monotone and 0 is representable); dividing by
  hi − lo > 0, dividing by max(‖x‖/C, 1) > 0 and rounding to float32 keep the sign (a
  correctly rounded operation on non-negative operands is ≥ 0); a mean of non-negative rows
  is non-negative. The generator checks the premise before it mixes (``generate``).
- ``declared`` and ``dp`` z-score the features: signs are free, R = 2C (x = −x′, ‖x‖ = C).
Noise multiplier z = σℓ/R (σ over the L2 sensitivity R/ℓ), q = ℓ/m.

``paper`` — the closest faithful reading of the paper's (lost) Theorem 1: WBK's RDP bound
for sampling without replacement (Wang, Balle, Kasiviswanathan 2019, Thm 27) with q and z as
above, composed over the T_c mixtures of one class (a record only enters its own class's
mixtures). It ignores that a replaced record can change class (case (b) below), so it misses
a case under replace-one: not a valid bound, for reproduction only.

``tight`` — pointwise over orders α, the max of:

(a) the record stays in its class c: replace-one inside class c, whose size N_c ≥ m is the
    same in both datasets; each class-c mixture is the Gaussian mechanism on a uniform
    ℓ-subset: WBK's bound at q_c = ℓ/N_c ≤ ℓ/m (it is non-decreasing in q: a polynomial in q
    with non-negative coefficients), composed T_c times; the other classes are unchanged.
    This equals the paper's curve.
(b) it moves from class a to class b: class a loses a record and class b gains one; the two
    classes' mixtures are independent, so their Rényi divergences add.
    Gains one (D vs D ∪ {x}, |D| = N ≥ m): draw the ℓ-subset of D ∪ {x} as "draw a uniform
    ℓ-subset S of D; with probability q′ = ℓ/(N + 1) replace a uniformly random member j of S
    by x" — given x is in, S minus a uniform member is a uniform (ℓ−1)-subset of D, so this is
    the uniform ℓ-subset of D ∪ {x}. Reveal (S, j), whose law is the same under both
    datasets: conditioned on them the pair is (N(μ, σ²I), (1−q′)N(μ, σ²I) + q′N(μ + v, σ²I))
    with v = (x − x_j)/ℓ, ‖v‖ ≤ R/ℓ. Rényi divergence is jointly quasi-convex (van Erven and
    Harremoës 2014, Thm 13), so the unconditional divergence is at most the largest
    conditional one; that pair lives on the line of v, its divergence grows with ‖v‖ (a
    smaller shift is the larger one with extra Gaussian noise added, after rescaling: a
    post-processing), so it is at most the Poisson-subsampled Gaussian's add/remove pair
    ((1−q′)N(0, z²) + q′N(1, z²), N(0, z²)) in either direction — Mironov, Talwar, Zhang
    2019 (Thm 5) show D_α(mixture ‖ N) ≥ D_α(N ‖ mixture), and dp_accounting's
    ``_compute_rdp_poisson_subsampled_gaussian(q, z, α)`` is the former. That RDP is
    non-decreasing in q (E[(1 + q(L − 1))^α] is convex in q with zero slope at 0, as
    E[L] = 1), and q′ = ℓ/(N + 1) ≤ ℓ/m, so q = ℓ/m bounds every class. "Loses one" is the
    same pair with the datasets swapped (D_a = (D_a ∖ {x}) ∪ {x}, q = ℓ/N_a ≤ ℓ/m).
    So (b) ≤ 2·T_c·RDP_Poisson(ℓ/m, z). With K = 1 no record can change class and (b) is
    absent.

The RDP of the release is the sup over neighbouring pairs, i.e. the pointwise max of (a) and
(b); ε at δ comes from ``epsilon_from_rdp``. Using ℓ/m (rather than ℓ/(m + 1), which both
neighbours satisfying the lower bound would allow in (b)) also keeps the bound valid when only
the dataset at hand, not its neighbour, is known to meet it.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian

from dpcore.accounting.composition import Cost
from dpcore.accounting.events import GaussianQuery, NoiseDescription, NoiseScale
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.accounting.wor_gaussian import rdp_wor_gaussian
from dpcore.mechanisms.class_mixing import mixture_sensitivity, per_class


def _as_int(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


#: Standardisations whose preprocessed features are all ≥ 0 (module docstring).
NONNEGATIVE = frozenset({"unit_range"})


def nonnegative_features(standardization: str) -> bool:
    """Whether a standardisation mode provably yields non-negative features."""
    if standardization not in ("unit_range", "declared", "dp"):
        raise ValueError(f"unknown standardization {standardization!r}")
    return standardization in NONNEGATIVE


@functools.lru_cache(maxsize=512)
def wor_curve(q: float, z: float) -> tuple[float, ...]:
    """WBK RDP of one subsampled-without-replacement Gaussian (replace-one) on ``ORDERS``."""
    return tuple(float(v) for v in rdp_wor_gaussian(q, z, ORDERS))


@functools.lru_cache(maxsize=512)
def poisson_curve(q: float, z: float) -> tuple[float, ...]:
    """MTZ RDP of one Poisson-subsampled Gaussian (add/remove) on ``ORDERS`` (inf where
    dp_accounting's series does not converge: conservative)."""
    return tuple(
        float(v) for v in np.asarray(_compute_rdp_poisson_subsampled_gaussian(q, z, ORDERS))
    )


@dataclass(frozen=True)
class DPCDAPaperEvent:
    """DP-CDA as the paper analyses it: WBK within one class, T_c = ⌈T/K⌉ mixtures."""

    n: int
    mixture_degree: int
    n_samples: int
    clip_norm: float
    n_classes: int
    min_class_size: int
    sigma: float
    # True where the standardisation makes every feature ≥ 0 (``nonnegative_features``):
    # records are then at most √2·C apart, not 2C.
    nonnegative: bool = False

    def __post_init__(self) -> None:
        for name in ("n", "mixture_degree", "n_samples", "n_classes", "min_class_size"):
            object.__setattr__(self, name, _as_int(name, getattr(self, name)))
        if not isinstance(self.nonnegative, bool):
            raise ValueError(f"nonnegative must be a bool, got {self.nonnegative!r}")
        for name in ("clip_norm", "sigma"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
            object.__setattr__(self, name, value)
        if self.n_classes < 1:
            raise ValueError(f"n_classes must be >= 1, got {self.n_classes}")
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")
        if self.mixture_degree < 1:
            raise ValueError(f"mixture_degree must be >= 1, got {self.mixture_degree}")
        if self.min_class_size < self.mixture_degree:
            raise ValueError(
                f"min_class_size must be >= mixture_degree={self.mixture_degree} (every class "
                f"must hold a mixture's records), got {self.min_class_size}"
            )
        if self.n_classes * self.min_class_size > self.n:
            raise ValueError(
                f"n_classes·min_class_size = {self.n_classes * self.min_class_size} exceeds "
                f"n={self.n}: no dataset has every class that large"
            )

    @property
    def mixtures_per_class(self) -> int:
        """T_c = ⌈T/K⌉."""
        return per_class(self.n_samples, self.n_classes)

    @property
    def sampling_prob(self) -> float:
        """ℓ/m, an upper bound on ℓ/N_c for every class."""
        return self.mixture_degree / self.min_class_size

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of one mixture mean (one member replaced): √2·C/ℓ or 2C/ℓ."""
        return mixture_sensitivity(
            clip_norm=self.clip_norm,
            mixture_degree=self.mixture_degree,
            nonnegative=self.nonnegative,
        )

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity

    def stay_curve(self) -> tuple[float, ...]:
        """Case (a): T_c · RDP_WOR(ℓ/m, z)."""
        per = np.asarray(wor_curve(self.sampling_prob, self.noise_multiplier))
        return tuple(float(v) for v in self.mixtures_per_class * per)

    def rdp(self) -> tuple[float, ...]:
        return self.stay_curve()

    def epsilon(self, delta: float) -> float:
        return epsilon_from_rdp(self.rdp(), delta=delta)

    def cost(self, delta: float) -> Cost:
        rdp = self.rdp()
        return Cost(epsilon=epsilon_from_rdp(rdp, delta=delta), delta=delta, rdp=rdp)

    def noise(self) -> NoiseDescription:
        # Labels are exact (a mixture's class): only the features are noised.
        scale = NoiseScale(
            "features",
            self.sigma,
            self.sensitivity,
            ("features",),
            "each mixture's mean of ℓ standardised, clipped records of one class",
        )
        return NoiseDescription(scales=(scale,), calibrated="features")

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "dpcda",
            "accountant": "paper",
            "mixtures_per_class": self.mixtures_per_class,
            "sampling_prob": self.sampling_prob,
            "noise_multiplier": self.noise_multiplier,
            **asdict(self),
        }


@dataclass(frozen=True)
class DPCDAEvent(DPCDAPaperEvent):
    """DP-CDA, valid under replace-one: max over orders of (a) the record stays in its class
    (WBK, T_c mixtures) and (b) it changes class (2·T_c Poisson-subsampled Gaussians)."""

    def move_curve(self) -> tuple[float, ...]:
        """Case (b): 2·T_c · RDP_Poisson(ℓ/m, z); zeros when K = 1 (no class to move to)."""
        if self.n_classes == 1:
            return tuple(0.0 for _ in ORDERS)
        per = np.asarray(poisson_curve(self.sampling_prob, self.noise_multiplier))
        return tuple(float(v) for v in 2 * self.mixtures_per_class * per)

    def rdp(self) -> tuple[float, ...]:
        return _tight_curve(self)

    def pld_epsilons(self, delta: float) -> tuple[float, float]:
        """(ε_a, ε_b) at δ of the two cases' PLDs (``accounting_pld``)."""
        return _pld_epsilons(self, float(delta))

    def pld_epsilon(self, delta: float) -> float:
        """The PLD's ε at δ: the larger of the two cases'."""
        return max(self.pld_epsilons(delta))

    def epsilon(self, delta: float) -> float:
        # Both analyses are valid for the same release: report the smaller (the RDP one wins
        # only where a mixture's loss passes the PLD's MAX_LOSS and the PLD gives up).
        return min(self.pld_epsilon(delta), epsilon_from_rdp(self.rdp(), delta=delta))

    def cost(self, delta: float) -> Cost:
        # The RDP curve stays on the cost: the ledger charges (ε, δ) or the curve.
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "accountant": "tight", "epsilon": "min(PLD, RDP)"}


@functools.lru_cache(maxsize=1024)
def _pld_epsilons(event: DPCDAEvent, delta: float) -> tuple[float, float]:
    # Events are immutable and hashable: calibration, preview and admission ask again.
    from dpcore.mechanisms.dpcda import accounting_pld

    with np.errstate(all="ignore"):
        eps = accounting_pld.epsilons(
            event.sampling_prob,
            event.noise_multiplier,
            event.mixtures_per_class,
            event.n_classes,
            delta,
        )
    # Extreme noise multipliers (a loss grid that cannot be built) give no PLD bound: inf,
    # so the RDP one is reported.
    return tuple(e if e == e else math.inf for e in eps)  # type: ignore[return-value]


@functools.lru_cache(maxsize=512)
def _tight_curve(event: DPCDAEvent) -> tuple[float, ...]:
    stay = np.asarray(event.stay_curve())
    move = np.asarray(event.move_curve())
    return tuple(float(v) for v in np.maximum(stay, move))


def statistics_step(*, stats_noise: float, n_features: int) -> GaussianQuery:
    """DP standardisation statistics: Gaussian noise on the per-feature sums and sums of
    squares of the [0, 1]-scaled features, which replace-one moves by at most √d each
    (√(2d) together; n is public). They compose with the mixtures, which are computed from
    records standardised with them."""
    return GaussianQuery(
        NoiseScale(
            "statistics",
            stats_noise,
            math.sqrt(2 * n_features),
            ("statistics",),
            "per-feature sums and sums of squares of the [0, 1]-scaled features",
        )
    )
