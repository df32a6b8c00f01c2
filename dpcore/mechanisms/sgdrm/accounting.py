"""SGDRM accountants: SGD on Random Mixtures (Lee, Lee, Kim, Suh, Ramchandran, ICLR 2018 WS).

Mechanism. T = ``n_samples`` mixtures are released. In mixture t, record i gets the coefficient
C_{t,i} = b·g with b ~ Bern(ℓ/n) (ℓ = ``mixture_width``) and g ~ N(0, 1/ℓ), independently over
(t, i); the mixture releases (Σ_i C_{t,i} x_i + N(0, σ² I), Σ_i C_{t,i} y_i + N(0, σ² I)).
Records are preprocessed to features in [0, 1] with ‖x‖ ≤ 1, and labels are one-hot. The σ of
both accountants is that one noise std, on features and on labels alike.

``paper`` — Theorem 1 of the paper: (ε, δ)-DP for δ < 1.46ℓ/n if

    σ² ≥ R(ε) := (4√T γ/(ℓ ε²)) · (√T γ log(4Tℓ/(nδ)) log(2T/δ) + 2ε),
    γ = √(2 log(2/δ) + 8ε) + √(2 log(2/δ)).

R is strictly decreasing in ε > 0: with a = 2 log(2/δ), γ/ε = √(a + 8ε)/ε + √a/ε, and
d/dε[√(a + 8ε)/ε] = −(a + 4ε)/(ε²√(a + 8ε)) < 0, so γ/ε and γ²/ε² decrease, and
R = 4T L₁L₂ (γ/ε)²/ℓ + 8√T (γ/ε)/ℓ with L₁ = log(4Tℓ/(nδ)) > 0 (δ < 1.46ℓ/n and T ≥ 1) and
L₂ = log(2T/δ) > 0. R → ∞ as ε → 0 and R → 0 as ε → ∞. So the ε of a given σ is the unique
root of R(ε) = σ², found by a bracketing root finder in log ε; the value returned is the
bracket end that satisfies σ² ≥ R(ε) (evaluated), i.e. ε satisfies the theorem's condition.
δ ≥ 1.46ℓ/n is refused, as the theorem requires. This number is reported for reproducing the
paper, NOT as a valid bound: the proof assumes bounded per-record influence, but Gaussian
coefficients are unbounded, so one record's contribution C_{t,i}·x_i has unbounded norm (and
the theorem is loose besides: n = T = 60000, ℓ = 128, δ = 1e-5 needs σ ≈ 1332 for ε = 10).

``tight`` — the variant ``coefficients="clipped"``: g is clipped to [−c, c], c =
``coefficient_bound`` (default 3/√ℓ, three standard deviations of g). Per mixture, record i
enters independently with probability q = ℓ/n (Poisson sampling) and contributes the vector
C·(x_i, y_i) with |C| ≤ c and ‖(x_i, y_i)‖² = ‖x_i‖² + ‖y_i‖² ≤ 2: norm ≤ R = c√2.

Charged: PROVEN dominating pairs (``dpcore.accounting.dpsgd``'s theorem: Balle–Barthe–
Gaboardi's advanced joint convexity on record i's own Bernoulli, with presence
‖u‖, ‖u′‖ ≤ a = √2c/σ and replacement ‖u − u′‖ ≤ Δ = 2c/σ, which non-negative features and
one-hot labels give), by three valid bounds, the smallest reported
(``SGDRMClippedEvent.epsilon``):
- the theorem's two-term pair (a and Δ), its PLD composed T times;
- the simpler pair (P*, Q*) of distance Δ (``accounting_pld``), its pessimistic PLD;
- the RDP curve of (P*, Q*), converted (dp_accounting's conversion).
Both use the inclusion probability q⁺ = ℓ/n + 2⁻⁵² (``accounting_pld.inclusion_probability``).
Cost: (ε, δ) and the proven pair's RDP curve, so the ledger can compose the entry by RDP.

Not charged (``replace_one_epsilon``, kept for comparison): dp_accounting's
``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under ``REPLACE_ONE``, the PLD of the
antipodal pair ((1−q)N(0, z²) + qN(−1, z²), (1−q)N(0, z²) + qN(1, z²)) with z = σ/R.
Revealing every clipped coefficient and the other records' draws reduces one mixture to
((1−q)N(s, σ²I) + qN(s + u, σ²I), (1−q)N(s, σ²I) + qN(s + u′, σ²I)), ‖u‖, ‖u′‖ ≤ R; that the
antipodal pair of radius R dominates every such pair is only checked numerically (2-D
hockey-stick integrals in the tests), not proved, so it bounds nothing here. It is smaller
than the proven pair where per-mixture losses are large (ℓ = 8, or ε = 10) and larger where
they are small (n = T = 10⁴, ℓ = 64, ε = 1), since its radius √2c exceeds half the proven
distance 2c. Its PLD uses value_discretization_interval 1e-3, then the finest of 5e-4 … 1e-5
whose PLD is predicted to stay within 1e5 points, and reports the smaller of the two.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant
from scipy import special
from scipy.optimize import brentq

from dpcore.accounting import dpsgd
from dpcore.accounting.composition import ApproximateDPEvent, Cost
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms.sgdrm import accounting_pld

#: Theorem 1 holds for δ < DELTA_FACTOR·ℓ/n.
DELTA_FACTOR = 1.46
#: Default clip of the Gaussian coefficient, in units of its std 1/√ℓ.
DEFAULT_COEFFICIENT_BOUND_STDS = 3.0
#: Per-record contribution norm over the coefficient bound: ‖(x, y)‖ ≤ √2.
RECORD_NORM = math.sqrt(2.0)
#: PLD discretisation: a coarse pass, then the finest of ``REFINED_INTERVALS`` whose PLD is
#: predicted (from the coarse one's size) to stay within ``REFINE_POINTS`` points.
COARSE_INTERVAL = 1e-3
REFINED_INTERVALS = (1e-5, 3e-5, 1e-4, 2e-4, 5e-4)
REFINE_POINTS = 100_000
COEFFICIENTS = ("clipped", "gaussian")


def mixture_noise(
    sigma: float, coefficient_bound: float, *, fixed: bool = False
) -> NoiseDescription:
    """One Gaussian on each mixture's joint (features, labels) row, to which one record
    contributes at most c·√2 (the coefficient bound times the record's norm). ``fixed``: the
    analysis fixed c, and the mechanism must use exactly it (its clip)."""
    scale = NoiseScale(
        "mixtures",
        sigma,
        coefficient_bound * RECORD_NORM,
        ("features", "labels"),
        "each mixture's random combination of (features, one-hot label) rows",
    )
    analysis = {"coefficient_bound": coefficient_bound} if fixed else {}
    return NoiseDescription(scales=(scale,), calibrated="mixtures", analysis=analysis)


def _as_int(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


def _check_common(n: int, ell: int, T: int, sigma: float) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= ell <= n:
        raise ValueError(f"mixture_width must be between 1 and n={n}, got {ell}")
    if T < 1:
        raise ValueError(f"n_samples must be >= 1, got {T}")
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be finite and > 0, got {sigma}")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _coerce(event: Any, *, bound: bool) -> None:
    """Validate a frozen event's fields and store them as plain Python numbers (dp_accounting
    must see floats, not numpy scalars); ``bound``: also its coefficient_bound."""
    for name in ("n", "mixture_width", "n_samples"):
        object.__setattr__(event, name, _as_int(name, getattr(event, name)))
    object.__setattr__(event, "sigma", float(event.sigma))
    _check_common(event.n, event.mixture_width, event.n_samples, event.sigma)
    if bound:
        value = float(event.coefficient_bound)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"coefficient_bound must be finite and > 0, got {value}")
        object.__setattr__(event, "coefficient_bound", value)


# --------------------------------------------------------------------------------------------
# paper: Theorem 1
# --------------------------------------------------------------------------------------------


def theorem1_log_rhs(epsilon: float, *, n: int, ell: int, T: int, delta: float) -> float:
    """log R(ε), the log of Theorem 1's right-hand side (σ² must be ≥ R(ε))."""
    a = 2 * math.log(2 / delta)
    gamma = math.sqrt(a + 8 * epsilon) + math.sqrt(a)
    inner = (
        math.sqrt(T) * gamma * math.log(4 * T * ell / (n * delta)) * math.log(2 * T / delta)
        + 2 * epsilon
    )
    return (
        math.log(4)
        + 0.5 * math.log(T)
        + math.log(gamma)
        - math.log(ell)
        - 2 * math.log(epsilon)
        + math.log(inner)
    )


def theorem1_epsilon(*, n: int, ell: int, T: int, sigma: float, delta: float) -> float:
    """The smallest ε (up to ~1e-12 relative, rounded up) with σ² ≥ R(ε).

    R is strictly decreasing (module docstring), so {ε : σ² ≥ R(ε)} = [ε*, ∞). The value
    returned was evaluated and satisfies the inequality.
    """
    _check_delta(delta)
    if delta >= DELTA_FACTOR * ell / n:
        raise ValueError(
            f"SGDRM Theorem 1 needs delta < 1.46·mixture_width/n = {DELTA_FACTOR * ell / n:.6g}; "
            f"got delta={delta:g}"
        )
    target = 2 * math.log(sigma)

    def excess(log_eps: float) -> float:
        return theorem1_log_rhs(math.exp(log_eps), n=n, ell=ell, T=T, delta=delta) - target

    t_hi = 0.0
    while excess(t_hi) > 0:
        t_hi += math.log(2)
        if t_hi > 690:
            raise ValueError(f"no epsilon below 1e300 satisfies Theorem 1 at sigma={sigma}")
    t_lo = t_hi - math.log(2)
    while excess(t_lo) <= 0:
        t_lo -= math.log(2)
        if t_lo < -690:
            return math.exp(t_hi)
    root = brentq(excess, t_lo, t_hi, xtol=1e-14, rtol=1e-14)
    eps = math.exp(root)
    for _ in range(200):
        if theorem1_log_rhs(eps, n=n, ell=ell, T=T, delta=delta) <= target:
            return eps
        eps = math.nextafter(eps * (1 + 1e-13), math.inf)
    return math.exp(t_hi)


@dataclass(frozen=True)
class SGDRMPaperEvent(ApproximateDPEvent):
    """SGDRM with Gaussian coefficients as Theorem 1 states it (reproduction, not a valid
    bound: the proof needs bounded per-record influence, Gaussian coefficients are unbounded)."""

    n: int
    mixture_width: int
    n_samples: int
    sigma: float

    def __post_init__(self) -> None:
        _coerce(self, bound=False)

    @property
    def max_delta(self) -> float:
        """Theorem 1 holds only for δ below this."""
        return DELTA_FACTOR * self.mixture_width / self.n

    def epsilon(self, delta: float) -> float:
        return theorem1_epsilon(
            n=self.n, ell=self.mixture_width, T=self.n_samples, sigma=self.sigma, delta=delta
        )

    def noise(self) -> NoiseDescription:
        # Nothing bounds a record's contribution; the sampler's lattice assumes the default.
        return mixture_noise(self.sigma, default_coefficient_bound(self.mixture_width))

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "sgdrm",
            "accountant": "paper",
            "coefficients": "gaussian",
            "max_delta": self.max_delta,
            **asdict(self),
        }


# --------------------------------------------------------------------------------------------
# tight: clipped coefficients, Poisson-subsampled Gaussian under replace-one (PLD)
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _pld(q: float, z: float, T: int, interval: float) -> pld_privacy_accountant.PLDAccountant:
    accountant = pld_privacy_accountant.PLDAccountant(
        dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=interval
    )
    accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), T)
    return accountant


def replace_one_epsilon(q: float, z: float, T: int, delta: float) -> float:
    """ε at δ of T-fold Poisson-subsampled Gaussians (rate q, noise multiplier z relative to
    one record's contribution bound) under replace-one, by dp_accounting's pessimistic PLD."""
    _check_delta(delta)
    q, z, T = float(q), float(z), int(T)
    accountant = _pld(q, z, T, COARSE_INTERVAL)
    coarse = float(accountant.get_epsilon(delta))
    size = _pld_points(accountant)
    for interval in REFINED_INTERVALS:
        if size * (COARSE_INTERVAL / interval) <= REFINE_POINTS:
            # Both are valid upper bounds; the finer one is usually (not always) smaller.
            return min(coarse, float(_pld(q, z, T, interval).get_epsilon(delta)))
    return coarse


def _pld_points(accountant: pld_privacy_accountant.PLDAccountant) -> float:
    """Number of points of the composed PLD (inf where dp_accounting's internals differ)."""
    try:
        return float(accountant._pld._pmf_remove.size)
    except AttributeError:
        return math.inf


@dataclass(frozen=True)
class SGDRMClippedEvent(ApproximateDPEvent):
    """SGDRM with coefficients b·clip(g, −c, c): T-fold Poisson-subsampled Gaussian (q = ℓ/n)
    under replace-one, contribution radius c√2, noise σ on features and labels."""

    n: int
    mixture_width: int
    n_samples: int
    sigma: float
    coefficient_bound: float

    def __post_init__(self) -> None:
        _coerce(self, bound=True)

    @property
    def sampling_prob(self) -> float:
        return self.mixture_width / self.n

    @property
    def contribution_bound(self) -> float:
        """R: the largest norm of one record's contribution c·(x, y) to one mixture."""
        return self.coefficient_bound * RECORD_NORM

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.contribution_bound

    @property
    def inclusion_probability(self) -> float:
        """q⁺ ≥ the generator's real inclusion probability (``accounting_pld``, 5)."""
        return accounting_pld.inclusion_probability(self.n, self.mixture_width)

    @property
    def proven_sensitivity(self) -> float:
        """Δ = 2c/σ of the proven dominating pair (``accounting_pld``, 1)."""
        return accounting_pld.sensitivity(self.sigma, self.coefficient_bound)

    def rdp(self) -> tuple[float, ...]:
        """The proven pair's RDP curve of the T mixtures on ``ORDERS``."""
        return accounting_pld.rdp_curve(
            self.inclusion_probability, self.proven_sensitivity, self.n_samples
        )

    def epsilon(self, delta: float) -> float:
        return _clipped_epsilon(self, float(delta))

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())

    def noise(self) -> NoiseDescription:
        return mixture_noise(self.sigma, self.coefficient_bound, fixed=True)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "sgdrm",
            "accountant": "tight",
            "coefficients": "clipped",
            "sampling_prob": self.sampling_prob,
            "noise_multiplier": self.noise_multiplier,
            **asdict(self),
        }


@functools.lru_cache(maxsize=1024)
def _clipped_epsilon(event: SGDRMClippedEvent, delta: float) -> float:
    # Events are immutable and hashable: calibration, preview and admission ask again.
    _check_delta(delta)
    # Every bound here is proven (``accounting_pld``, ``dpcore.accounting.dpsgd``);
    # dp_accounting's antipodal pair (``replace_one_epsilon``) is not charged: its domination
    # is only checked numerically.
    q, T = event.inclusion_probability, event.n_samples
    two_term = dpsgd.epsilon(
        sampling_prob=q,
        present=event.coefficient_bound * RECORD_NORM / event.sigma,
        replaced=event.proven_sensitivity,
        steps=T,
        delta=delta,
        gaussian_mu=0.0,
    )
    proven = accounting_pld.pld_epsilon(q, event.proven_sensitivity, T, delta)
    rdp = accounting_pld.rdp_epsilon(q, event.proven_sensitivity, T, delta)
    return min(two_term, proven, rdp)


#: Share of δ the coupling may take when it picks its analysis bound c (the rest stays with
#: the clipped analysis).
COUPLING_DELTA_SHARE = 0.1


def exceed_probability(coefficient_bound: float, mixture_width: int) -> float:
    """P(|g| > c) for g ~ N(0, 1/ℓ), rounded up by a relative 1e-9 (float erfc)."""
    return float(special.erfc(coefficient_bound * math.sqrt(mixture_width / 2))) * (1 + 1e-9)


def magnitude_exceed_probability(*, n: int, mixture_width: int, T: int, bound: float) -> float:
    """An upper bound on P(some mixture's members have Σ|g| > n·c) for g ~ N(0, 1/ℓ), c =
    ``bound``: outside that event the float cover's magnitude n·c√2 (``generate``) holds for
    unclipped coefficients too. A mixture has at most n members, so its Σ|g| is dominated by
    n of them; Chernoff with E e^{λ|g|} ≤ 2e^{λ²/(2ℓ)} at λ = cℓ gives, per mixture,
    exp(n·(ln 2 − c²ℓ/2)); a union over the T mixtures. Rounded up by a relative 1e-9, as
    ``exceed_probability`` (the float log and exp err by ~|log p|·2⁻⁵³ relative, below that
    wherever p does not underflow: |log p| < 709); it underflows to 0 only below 1e-308, far
    under any δ's last bit."""
    log_p = math.log(T) + n * (math.log(2.0) - bound * bound * mixture_width / 2)
    return 1.0 if log_p >= 0 else min(1.0, math.exp(log_p) * (1 + 1e-9))


def coupling_bound(*, epsilon: float, delta: float, n: int, mixture_width: int, T: int) -> float:
    """c with (1 + e^ε)·T·(ℓ/n)·P(|g| > c) = COUPLING_DELTA_SHARE·δ."""
    target = COUPLING_DELTA_SHARE * delta / ((1 + math.exp(min(epsilon, 700.0))) * T)
    tail = min(1.0, target * n / mixture_width)
    return float(special.erfcinv(tail)) * math.sqrt(2 / mixture_width)


@dataclass(frozen=True)
class SGDRMGaussianEvent(ApproximateDPEvent):
    """SGDRM with the paper's unbounded coefficients b·g, g ~ N(0, 1/ℓ), by coupling.

    For neighbours differing in record i, let M′ be the mechanism with record i's
    coefficients (only) clipped to [−c, c]. M and M′ differ only when some mixture includes
    record i with |g| > c: TV(M(D), M′(D)) ≤ τ = T·(ℓ/n)·P(|g| > c). M′ is the clipped
    variant's pair for record i (the other records' coefficients are a common shift, revealed
    to the adversary as in the clipped analysis), (ε, δ′)-DP by that PLD; so M is
    (ε, δ′ + (1 + e^ε)τ)-DP, τ also carrying the probability that the float cover's
    magnitude fails (``magnitude_exceed_probability``). ε is the least fixed point of
    ε = ε_clip(c; δ − (1 + e^ε)τ), reached from below and verified.

    c is an analysis parameter (nothing is clipped): ``coefficient_bound`` when given (the
    service fixes it from the target ε when it calibrates), else chosen at each δ from
    public quantities only, never below the default 3/√ℓ the worker's noise lattice assumes.
    """

    n: int
    mixture_width: int
    n_samples: int
    sigma: float
    coefficient_bound: float | None = None

    def __post_init__(self) -> None:
        _coerce(self, bound=self.coefficient_bound is not None)

    @property
    def sampling_prob(self) -> float:
        return self.mixture_width / self.n

    def _clipped_epsilon(self, c: float, delta: float) -> float:
        """ε at δ of the clipped variant with bound c (what M′ is for record i)."""
        if delta <= 0:
            return math.inf
        clipped = SGDRMClippedEvent(self.n, self.mixture_width, self.n_samples, self.sigma, c)
        return clipped.epsilon(min(delta, 1 - 1e-12))

    def candidate_bounds(self, delta: float) -> list[float]:
        """The c values the coupling tries at δ (each a function of public quantities)."""
        if self.coefficient_bound is not None:
            return [self.coefficient_bound]
        floor = default_coefficient_bound(self.mixture_width)
        candidates = [floor]
        # c ↦ the bound giving the coupling a tenth of δ at the clipped ε of c: increasing in
        # c, so the iteration climbs towards a consistent pair (or past any useful one).
        for _ in range(6):
            eps = self._clipped_epsilon(candidates[-1], (1 - COUPLING_DELTA_SHARE) * delta)
            if not math.isfinite(eps):
                break
            following = coupling_bound(
                epsilon=eps,
                delta=delta,
                n=self.n,
                mixture_width=self.mixture_width,
                T=self.n_samples,
            )
            if not (math.isfinite(following) and following > floor):
                break
            if abs(following - candidates[-1]) <= 1e-3 * candidates[-1]:
                break
            candidates.append(following)
        return candidates

    def coupling_tv(self, c: float) -> float:
        """τ: the probability that record i ever enters a mixture with |g| > c, plus that of
        the event outside which the noise's float cover holds for the unclipped coefficients
        (some mixture's Σ|g| past n·c_w, c_w the bound the lattice assumes: ``noise``). Both
        events are of the coins alone, the same on neighbours."""
        inclusion = self.n_samples * self.sampling_prob * exceed_probability(c, self.mixture_width)
        magnitude = magnitude_exceed_probability(
            n=self.n, mixture_width=self.mixture_width, T=self.n_samples, bound=self._lattice_bound
        )
        return min(1.0, inclusion + magnitude)

    @property
    def _lattice_bound(self) -> float:
        if self.coefficient_bound is None:
            return default_coefficient_bound(self.mixture_width)
        return self.coefficient_bound

    def epsilon(self, delta: float) -> float:
        _check_delta(delta)
        return min(self._coupled_epsilon(c, delta) for c in self.candidate_bounds(delta))

    def _coupled_epsilon(self, c: float, delta: float) -> float:
        tau = self.coupling_tv(c)

        def h(eps: float) -> float:
            slack = (1 + math.exp(min(eps, 700.0))) * tau
            return self._clipped_epsilon(c, delta - slack)

        eps = h(0.0)  # (1 + e^ε) ≥ 2: at or below the least fixed point
        for _ in range(60):
            if not math.isfinite(eps):
                return math.inf
            candidate = eps * (1 + 1e-9) + 1e-12
            if h(candidate) <= candidate:
                return candidate
            eps = h(candidate)
        return math.inf

    def noise(self) -> NoiseDescription:
        # The lattice assumes c (or the default 3/√ℓ when c is chosen per δ: every candidate
        # is at least that large, so the rounding slack stays covered).
        return mixture_noise(
            self.sigma, self._lattice_bound, fixed=self.coefficient_bound is not None
        )

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "sgdrm",
            "accountant": "tight",
            "coefficients": "gaussian",
            "analysis": "coupling with the clipped variant (TV added to delta)",
            "sampling_prob": self.sampling_prob,
            **asdict(self),
        }


def default_coefficient_bound(mixture_width: int) -> float:
    return DEFAULT_COEFFICIENT_BOUND_STDS / math.sqrt(mixture_width)


def paper(sigma: float, keys: Mapping[str, Any]) -> SGDRMPaperEvent:
    return SGDRMPaperEvent(keys["n"], keys["mixture_width"], keys["n_samples"], sigma)


def tight(sigma: float, keys: Mapping[str, Any]) -> SGDRMClippedEvent | SGDRMGaussianEvent:
    ell = keys["mixture_width"]
    bound = keys["coefficient_bound"]
    if keys["coefficients"] == "gaussian":
        return SGDRMGaussianEvent(keys["n"], ell, keys["n_samples"], sigma, bound)
    return SGDRMClippedEvent(
        keys["n"],
        ell,
        keys["n_samples"],
        sigma,
        default_coefficient_bound(ell) if bound is None else bound,
    )


def guess_paper(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    try:
        log_rhs = theorem1_log_rhs(
            epsilon, n=keys["n"], ell=keys["mixture_width"], T=keys["n_samples"], delta=delta
        )
    except ValueError:
        return 1.0
    return math.exp(log_rhs / 2)  # Theorem 1 solved for σ: the exact answer


def prepare_tight(keys: dict[str, Any], epsilon: float, delta: float) -> dict[str, Any]:
    """Calibrating Gaussian coefficients to ε: fix the coupling's c for that ε up front."""
    if keys["coefficients"] != "gaussian" or keys["coefficient_bound"] is not None:
        return keys
    ell = keys["mixture_width"]
    c = coupling_bound(
        epsilon=epsilon, delta=delta, n=keys["n"], mixture_width=ell, T=keys["n_samples"]
    )
    return {**keys, "coefficient_bound": max(default_coefficient_bound(ell), c)}


def guess_tight(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    # Unamplified replace-one Gaussian (sensitivity 2R), scaled by the rate and √T.
    ell, n, T = keys["mixture_width"], keys["n"], keys["n_samples"]
    c = keys["coefficient_bound"] or default_coefficient_bound(ell)
    sigma = math.sqrt(2 * math.log(1.25 / delta)) * 2 * c * RECORD_NORM / epsilon
    return sigma * max(ell / n * math.sqrt(T), 1e-3)
