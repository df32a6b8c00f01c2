"""DPGM accountants: DP kernel k-means, then DP-SGD (Acs, Melis, Castelluccia, De Cristofaro,
*Differentially Private Mixture of Generative Neural Networks*, Sections III-A to III-D).

Mechanism and the meaning of every σ (replace-one neighbours, n public). dprelease's σ is the
**standard deviation of the noise per unit of the per-record bound** (what is actually added).
The paper writes its noise as N(0, √2·σ′·bound) with its own scale σ′, so σ′ = σ/√2.

- k-means, T_K = ``kmeans_iterations`` iterations (Alg. 2). Each iteration adds N(0, σ_K²) to
  each of the k cluster sizes and N(0, σ_K² C_s² I) to each cluster's sum of random Fourier
  features ‖ẑ(x)‖ ≤ C_s. ``rbf=true``: C_s = 1 is a public constant that the features meet
  exactly (cos and sin pairs scaled by 1/√k: norm 1 up to the rounding the sampler covers; the
  paper's Theorem 2 bounds only the *expected* norm, and clips at Alg. 2 line 5) and DPNorm is
  not run. ``rbf=false``: DPNorm (Alg. 3)
  releases a histogram of the feature norms with N(0, σ_C²) per bin; it is charged once per
  iteration, as in the paper's Eq. 3 (Alg. 2 runs it once: charging T_K runs covers both).
- DP-SGD, T_S = ``sgd_steps`` steps (Alg. 4). Each step draws a Poisson batch, every record
  independently with probability q = L/n (L = ``batch_size``), and releases, computed from that
  batch only, (a) DPNorm's histogram of the per-record gradient norms + N(0, σ_C² I) and (b) the
  sum of the gradients clipped to the released C_s + N(0, σ_S² C_s² I), σ_S = ``--sigma``.
  Several models (one per cluster) are covered as long as each record's clipped gradient
  enters one model's block (the concatenation still has norm ≤ C_s). Not covered: Alg. 1 line
  4 as printed (pick cluster s with probability |D̂_s|/|D|, then sample within it): it uses the
  private cluster sizes and does not sample records independently.

``tight`` (a valid upper bound):

- k-means: replacing x by x′ either moves one record between clusters i ≠ j (sizes change by
  ±1: √2; sums by −ẑ(x) and +ẑ(x′): ≤ √2·C_s) or keeps it in one cluster (sizes unchanged; the
  sum moves by ẑ(x′) − ẑ(x), up to 2·C_s because RFF features take both signs: the paper's
  √2·C_s misses this case). In noise units both cases give ‖Δ‖ ≤ 2/σ_K, so an iteration is the
  Gaussian mechanism with μ = 2/σ_K; DPNorm's histogram moves by e_j − e_i: μ = √2/σ_C. GDP
  composes adaptively: μ_K² = T_K·(4/σ_K² + [not rbf]·2/σ_C²), exact.
- SGD step: every record joins the batch independently with probability q = L/n, and the
  step releases two Gaussians of that batch in sequence, the clip C of the second read from the
  first. Whitened by their noise stds, one record's presence moves them by at most
  a = √(1/σ_C² + 1/σ_S²) (a one-hot histogram entry; a gradient clipped to ≤ C, in units of
  C) and its replacement by at most Δ = √(2/σ_C² + 4/σ_S²) (a count moved between two bins;
  two clipped gradients), for every C. ``dpcore.accounting.dpsgd`` proves that such a step is
  dominated, at every γ and in both orders, by its two-term pair built from these a and Δ (or
  the simpler symmetric pair (P*, Q*) of ``dpcore.accounting.pld``, p = q, distance Δ):
  Balle–Barthe–Gaboardi's advanced joint convexity on the record's own inclusion coin, and
  GDP's adaptive composition for the two releases (which is what covers the adaptive clip:
  each release is bounded for every threshold the first may pick). No assumption that
  antipodal contributions are the worst case: dp_accounting's ``PoissonSampledDpEvent`` under
  ``REPLACE_ONE`` (that antipodal pair, at z = 1/a) is only a numerical comparison in the tests.
- Composition: the T_S steps' pair composed T_S times and the k-means part, μ_K-GDP, as
  (N(0, 1), N(μ_K, 1)): dominating pairs compose (Zhu, Dong, Wang 2022, Thm 10). Pessimistic
  connect-the-dots PLDs (``dpcore.accounting.dpsgd.epsilon``), so the reported ε is an upper
  bound. Cost: (ε, δ) only.

``paper`` (Theorem 4, *not* a valid bound under replace-one; reported, never ledgered): with
σ′ = σ/√2 for σ_K, σ_C, σ_S,

    α_K(λ) = T_K (λ² + λ)([not rbf]/(4σ′_C²) + 1/(2σ′_K²))                      (Eq. 3)
    α_S(λ) = T_S · min_{j ∈ J} j α_G(λ/j; σ′_C) + (1 − j) α_G(λ/(1 − j); σ′_S)    (Eq. 4)
    α_G(λ; σ) = log max(E1, E2),  E1 = ∫ μ0 (μ0/μ1)^λ,  E2 = ∫ μ1 (μ1/μ0)^λ,
    μ0 = N(0, σ²), μ1 = (1 − q) N(0, σ²) + q N(1, σ²),
    ε = min_{λ ∈ {1, …, λ_max}} (α_K(λ) + α_S(λ) + log(1/δ)) / λ                  (Thm 4)

with J the 10 Hölder weights 0.05, 0.15, …, 0.95 and E1/E2 by numerical integration in log
space (trapezoid rule on a grid fine enough for the integrands' analyticity strip). For integer
λ, E2 is the sampled-Gaussian moment Σ_k C(λ+1, k)(1−q)^{λ+1−k} q^k e^{(k²−k)/(2σ²)} and
α_G(λ) = λ·RDP(λ + 1) of the add/remove subsampled Gaussian. Why it is not valid: Lemma 1's
Gaussian moment (λ² + λ)/(4σ²) is half the true (λ² + λ)/(2σ²) (its proof's normal privacy loss
N(1/(2σ²), 1/σ²) has that mgf), so Eq. 3 is half of what the k-means Gaussians cost; the k-means
sum's sensitivity is 2·C_s when x and x′ share a cluster; and E1/E2 are the add/remove pair
(shift 1 with σ′), while replace-one shifts two contributions ±C_s. The Hölder composition of
Theorem 3 itself is valid (looser than one combined Gaussian).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import logsumexp

from dpcore.accounting import dpsgd
from dpcore.accounting.accountant import Event
from dpcore.accounting.composition import ApproximateDPEvent
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms.dpgm import PAPER_LAMBDA_MAX
from dpcore.mechanisms.dpgm.params import batch_size_for

SQRT2 = math.sqrt(2.0)
#: The paper's "10 different values of j_1" (j_2 = 1 − j_1): midpoints of a tenth grid.
HOLDER_WEIGHTS: tuple[float, ...] = tuple((i + 0.5) / 10 for i in range(10))
# Beyond these the tight event reports ε = ∞ (see ``DPGMEvent.epsilon``): a valid bound. They
# bound the PLD grid, hence the time one ε takes, and a calibration to ε = 10⁶ evaluates dozens
# of them while the request holds the ledger's lock (CI: schemathesis, POST /releases for dpgm
# at ε = 10⁶). Any target above what the caps reach is met with the cap's smaller ε: never
# above the target. DISTANCE_CAP is Δ̄ of one SGD step (4: a combined multiplier z = 1/2).
MU_CAP = 4.0
DISTANCE_CAP = 4.0

_TAIL_STDS = 14.0  # integrands are ≤ e^{−98} of their peak this many σ outside the peak range
_WINDOW = 60.0  # log-integrand values further below the maximum are dropped (e^{−60})


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if out < low:
        raise ValueError(f"{name} must be >= {low}, got {out}")
    return out


def _check_sigma(name: str, value: Any) -> float:
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return out


def _parse_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


# --- paper: E1/E2 by numerical integration -------------------------------------------------


def _log_ratio(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """log(μ1/μ0)(x) = log(1 − q + q·exp((2x − 1)/(2σ²))), stable for every x."""
    if q >= 1.0:
        return (2 * x - 1) / (2 * sigma**2)
    return np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))


def _log_integral(
    log_f: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, sigma: float
) -> float:
    """log ∫_lo^hi e^{log_f}, for a log-integrand with log_f'' ≥ −1/σ² or log-concave.

    A coarse pass (step σ/2) finds where log_f is within ``_WINDOW`` of its maximum: with
    log_f'' ≥ −1/σ² the function exceeds the chord between two coarse points by at most 1/32,
    and a concave function's superlevel set is an interval ending before the next coarse point,
    so nothing outside the windows (each extended by one coarse step) matters. Each window is
    then integrated by the trapezoid rule with step min(σ, σ²)/8.
    """
    coarse_step = sigma / 2
    coarse = np.linspace(lo, hi, max(math.ceil((hi - lo) / coarse_step), 1) + 1)
    values = log_f(coarse)
    keep = values > values.max() - _WINDOW
    # Runs of kept coarse points, each grown by one point on both sides.
    grown = keep.copy()
    grown[1:] |= keep[:-1]
    grown[:-1] |= keep[1:]
    edges = np.flatnonzero(np.diff(np.concatenate(([0], grown.astype(np.int8), [0]))))
    step = min(sigma, sigma * sigma) / 8
    parts = []
    for first, stop in zip(edges[::2], edges[1::2], strict=True):
        a, b = coarse[first], coarse[stop - 1]
        x = np.linspace(a, b, max(math.ceil((b - a) / step), 1) + 1)
        h = x[1] - x[0]
        logs = log_f(x)
        logs[0] += math.log(0.5)
        logs[-1] += math.log(0.5)
        parts.append(float(logsumexp(logs)) + math.log(h))
    return float(logsumexp(parts))


def log_e1_e2(lam: float, sigma: float, q: float) -> tuple[float, float]:
    """(log E1(λ, σ), log E2(λ, σ)) of the paper's Eq. 4 for real λ > 0, integrated numerically.

    E2 = ∫ μ0 (μ1/μ0)^{λ+1} has log-integrand f = log μ0 + (λ+1)·L with L = log(μ1/μ0) convex,
    so f'' ≥ −1/σ²; its stationary points x = (λ+1)·w(x), w ∈ (0, 1), lie in [0, λ+1], and outside
    that range f falls at least like a Gaussian of std σ. E1 = ∫ μ0 e^{−λL} is log-concave with
    its peak in [−λ, 0]. Both are integrated over their peak range padded by 14σ (tails below
    e^{−98} of the peak). The integrands are analytic in a strip of half-width πσ² (the zeros of
    1 − q + q e^z), so the trapezoid rule with step min(σ, σ²)/8 converges to double precision.
    """
    if not (lam > 0 and sigma > 0 and 0 < q <= 1):
        raise ValueError(f"need lam > 0, sigma > 0, 0 < q <= 1; got {lam}, {sigma}, {q}")
    pad = _TAIL_STDS * sigma
    log_norm = -0.5 * math.log(2 * math.pi) - math.log(sigma)

    def log_f1(x: np.ndarray) -> np.ndarray:
        return log_norm - x * x / (2 * sigma**2) - lam * _log_ratio(x, sigma, q)

    def log_f2(x: np.ndarray) -> np.ndarray:
        return log_norm - x * x / (2 * sigma**2) + (lam + 1) * _log_ratio(x, sigma, q)

    return (
        _log_integral(log_f1, -lam - pad, pad, sigma),
        _log_integral(log_f2, -pad, lam + 1 + pad, sigma),
    )


@functools.lru_cache(maxsize=64)
def _alpha_g_table(
    sigma: float, q: float, lambda_max: int, weights: tuple[float, ...]
) -> np.ndarray:
    """α_G(λ/j) = log max(E1, E2) at λ = 1 … λ_max (rows) and j ∈ ``weights`` (columns)."""
    out = np.empty((lambda_max, len(weights)))
    for row in range(lambda_max):
        for col, weight in enumerate(weights):
            out[row, col] = max(log_e1_e2((row + 1) / weight, sigma, q))
    return out


def alpha_sgd(*, sigma_norm: float, sigma_sgd: float, q: float, lambda_max: int) -> np.ndarray:
    """Eq. 4 for one SGD step at λ = 1 … λ_max (index λ − 1), at the paper's scales σ′:
    min over j_1 ∈ J of j_1 α_G(λ/j_1; σ′_C) + j_2 α_G(λ/j_2; σ′_S), j_2 = 1 − j_1."""
    j1 = HOLDER_WEIGHTS
    j2 = tuple(1.0 - j for j in j1)
    norm_part = np.asarray(j1) * _alpha_g_table(sigma_norm, q, lambda_max, j1)
    sgd_part = np.asarray(j2) * _alpha_g_table(sigma_sgd, q, lambda_max, j2)
    return np.min(norm_part + sgd_part, axis=1)


@dataclass(frozen=True)
class DPGMPaperEvent(ApproximateDPEvent):
    """DPGM as Theorem 4 computes it (σ's in dprelease units; σ′ = σ/√2 inside)."""

    n: int
    batch_size: int
    sgd_steps: int
    kmeans_iterations: int
    sigma_sgd: float
    sigma_kmeans: float
    sigma_norm: float
    rbf: bool = True
    lambda_max: int = PAPER_LAMBDA_MAX
    final_counts: bool = False

    def __post_init__(self) -> None:
        _coerce(self)
        object.__setattr__(self, "lambda_max", _check_int("lambda_max", self.lambda_max, 1))

    @property
    def q(self) -> float:
        return self.batch_size / self.n

    def alpha_kmeans(self) -> np.ndarray:
        """Eq. 3 at λ = 1 … λ_max."""
        lam = np.arange(1, self.lambda_max + 1, dtype=float)
        sk, sc = self.sigma_kmeans / SQRT2, self.sigma_norm / SQRT2
        per_iteration = 1 / (2 * sk**2) + (0.0 if self.rbf else 1 / (4 * sc**2))
        # The final clusters' noisy sizes: one more Gaussian of Lemma 1 at σ′_K.
        counts = 1 / (4 * sk**2) if self.final_counts else 0.0
        return (self.kmeans_iterations * per_iteration + counts) * (lam**2 + lam)

    def alpha_sgd(self) -> np.ndarray:
        """Eq. 4 (T_S steps) at λ = 1 … λ_max."""
        if self.sgd_steps == 0:
            return np.zeros(self.lambda_max)
        per_step = alpha_sgd(
            sigma_norm=self.sigma_norm / SQRT2,
            sigma_sgd=self.sigma_sgd / SQRT2,
            q=self.q,
            lambda_max=self.lambda_max,
        )
        return self.sgd_steps * per_step

    def epsilon(self, delta: float) -> float:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        lam = np.arange(1, self.lambda_max + 1, dtype=float)
        total = self.alpha_kmeans() + self.alpha_sgd() + math.log(1 / delta)
        return float(np.min(total / lam))

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": "dpgm", "accountant": "paper", "q": self.q, **asdict(self)}


# --- tight ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPGMEvent(ApproximateDPEvent):
    """DPGM under replace-one: k-means as exact GDP, DP-SGD as a replace-one Poisson-subsampled
    Gaussian, composed in dp_accounting's PLD accountant (see the module docstring)."""

    n: int
    batch_size: int
    sgd_steps: int
    kmeans_iterations: int
    sigma_sgd: float
    sigma_kmeans: float
    sigma_norm: float
    rbf: bool = True
    # The served pipeline releases the final clusters' noisy sizes (counts only, N(0, σ_K²)
    # each: a record moved between clusters changes two counts by 1, μ² = 2/σ_K²).
    final_counts: bool = False

    def __post_init__(self) -> None:
        _coerce(self)

    @property
    def q(self) -> float:
        return self.batch_size / self.n

    @property
    def kmeans_mu(self) -> float:
        """μ of the whole k-means phase (replace-one, noise units), exact GDP composition."""
        per_iteration = 4 / self.sigma_kmeans**2 + (0.0 if self.rbf else 2 / self.sigma_norm**2)
        counts = 2 / self.sigma_kmeans**2 if self.final_counts else 0.0
        return math.sqrt(self.kmeans_iterations * per_iteration + counts)

    @property
    def sgd_noise_multiplier(self) -> float:
        """z = (1/σ_C² + 1/σ_S²)^(−1/2): the noise of one SGD step's two releases relative to
        one record's whitened contribution (present against absent: ``sgd_present`` = 1/z)."""
        return 1.0 / math.sqrt(1 / self.sigma_norm**2 + 1 / self.sigma_sgd**2)

    @property
    def sgd_present(self) -> float:
        """a: how far one record's presence moves one step's whitened releases (a one-hot
        histogram entry, 1/σ_C; a clipped gradient, ≤ 1/σ_S)."""
        return math.sqrt(1 / self.sigma_norm**2 + 1 / self.sigma_sgd**2)

    @property
    def sgd_replaced(self) -> float:
        """Δ: how far replacing one record moves them (a count moved between bins, √2/σ_C;
        two clipped gradients, ≤ 2/σ_S)."""
        return math.sqrt(2 / self.sigma_norm**2 + 4 / self.sigma_sgd**2)

    @property
    def sgd_distance(self) -> float:
        """Δ̄ of one step's proven dominating pair (``dpcore.accounting.dpsgd``)."""
        return sgd_step_distance(sigma_sgd=self.sigma_sgd, sigma_norm=self.sigma_norm)

    @property
    def sampling_prob(self) -> float:
        """q⁺: L/n rounded up (the sampler's rate is exactly L/n)."""
        return dpsgd.rate(self.batch_size, self.n)

    def epsilon(self, delta: float) -> float:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if self.kmeans_mu > MU_CAP or self.sgd_distance > DISTANCE_CAP:
            # Far past any budget (the k-means part alone is ε > 1000 at δ = 1e-5), and the
            # PLD grid would not fit in memory: infinity is a valid bound. Calibration passes
            # through here on its way down from such σ's.
            return math.inf
        return dpsgd.epsilon(
            sampling_prob=self.sampling_prob,
            present=self.sgd_present,
            replaced=self.sgd_replaced,
            steps=self.sgd_steps,
            delta=float(delta),
            gaussian_mu=self.kmeans_mu,
        )

    def noise(self) -> NoiseDescription:
        return _noise(self)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "dpgm",
            "accountant": "tight",
            "q": self.q,
            "kmeans_mu": self.kmeans_mu,
            "sgd_noise_multiplier": self.sgd_noise_multiplier,
            "sgd_step_distance": self.sgd_distance,
            **asdict(self),
        }


def _coerce(event: DPGMEvent | DPGMPaperEvent) -> None:
    # Plain Python numbers only (dp_accounting drops numpy scalars as unsupported events).
    setattr_ = object.__setattr__
    setattr_(event, "n", _check_int("n", event.n, 1))
    setattr_(event, "batch_size", _check_int("batch_size", event.batch_size, 1))
    setattr_(event, "sgd_steps", _check_int("sgd_steps", event.sgd_steps, 0))
    setattr_(
        event, "kmeans_iterations", _check_int("kmeans_iterations", event.kmeans_iterations, 0)
    )
    if event.batch_size > event.n:
        raise ValueError(f"batch_size must be <= n={event.n}, got {event.batch_size}")
    for name in ("sigma_sgd", "sigma_kmeans", "sigma_norm"):
        setattr_(event, name, _check_sigma(name, getattr(event, name)))
    setattr_(event, "rbf", _parse_flag(event.rbf))
    setattr_(event, "final_counts", _parse_flag(event.final_counts))


def _noise(event: DPGMEvent | DPGMPaperEvent) -> NoiseDescription:
    """σ's are per unit of the per-record bound; the sensitivities are how far one replaced
    record moves a noised vector, in those units (module docstring)."""
    return NoiseDescription(
        scales=(
            NoiseScale(
                "kmeans",
                event.sigma_kmeans,
                2.0,
                ("cluster sizes", "cluster feature sums"),
                "every k-means iteration: cluster sizes and sums of clipped random Fourier "
                "features (sums in units of C_s); the final clusters' sizes",
            ),
            NoiseScale(
                "norm_histogram",
                event.sigma_norm,
                SQRT2,
                ("norm histograms",),
                "DPNorm's histogram of norms (k-means features unless rbf; every SGD batch's "
                "gradients)",
            ),
            NoiseScale(
                "gradients",
                event.sigma_sgd,
                2.0,
                ("gradients",),
                "every DP-SGD step: the Poisson batch's sum of clipped gradients (in units of "
                "the released clip C_s)",
            ),
        ),
        calibrated="gradients",
    )


def sgd_steps(epochs: float, n: int, batch_size: int) -> int:
    """T_S = ⌈epochs · n / L⌉: the steps of ``epochs`` expected passes over n records."""
    return max(1, math.ceil(epochs * n / batch_size - 1e-9))


def sgd_schedule(batch_size: int | None, epochs: float, n: int) -> tuple[int, int]:
    """(L, T_S) of a release: its batch (``params.batch_size_for``) and ⌈epochs·n/L⌉ steps —
    the one rule admission, the accountant and the job read."""
    batch = batch_size_for(batch_size, n)
    return batch, sgd_steps(epochs, n, batch)


def _schedule(keys: Mapping[str, Any]) -> tuple[int, int]:
    """(L, T_S) from an accountant's keys: ``sgd_steps`` when given, else the release's."""
    batch, steps = sgd_schedule(keys["batch_size"], float(keys["epochs"]), int(keys["n"]))
    if keys.get("sgd_steps") is not None:
        steps = int(keys["sgd_steps"])
    return batch, steps


def kmeans_iterations(clusters_per_class: int, refine: int) -> int:
    """T_K of the served k-means (``dpcore.mechanisms.kmeans.kmeans_steps``)."""
    from dpcore.mechanisms.kmeans import kmeans_steps

    return kmeans_steps(clusters_per_class, refine)


def sgd_step_distance(*, sigma_sgd: float, sigma_norm: float) -> float:
    """Δ̄ of one SGD step (``DPGMEvent.sgd_distance``) from its two noise scales."""
    present = math.sqrt(1 / sigma_norm**2 + 1 / sigma_sgd**2)
    replaced = math.sqrt(2 / sigma_norm**2 + 4 / sigma_sgd**2)
    return dpsgd.distance(present, replaced)


def sgd_mu(*, q: float, steps: int, step_distance: float) -> float:
    """Central-limit μ of T_S steps dominated by the pair (P*, Q*) of distance Δ̄:
    q·√(T_S·(e^{Δ̄²} − 1)) (√ of T_S times one step's χ² divergence; Bu et al. 2020). Used
    only to split the budget between phases; the ε charged is the PLD's."""
    return q * math.sqrt(steps * math.expm1(min(step_distance**2, 700.0)))


def kmeans_sigma(
    *, sigma_sgd: float, sigma_norm: float, q: float, steps: int, iterations: int, share: float
) -> float:
    """σ_K such that the k-means phase (T_K steps at μ² = 4/σ_K² and the final sizes at
    2/σ_K²) gets ``share`` of μ² against the DP-SGD phase's central-limit μ²."""
    distance = sgd_step_distance(sigma_sgd=sigma_sgd, sigma_norm=sigma_norm)
    mu_sgd = sgd_mu(q=q, steps=steps, step_distance=distance)
    mu_kmeans = math.sqrt(share / (1 - share)) * mu_sgd
    return math.sqrt(4 * iterations + 2) / mu_kmeans


def _derived(sigma: float, keys: Mapping[str, Any]) -> dict[str, Any]:
    """The served pipeline's T_S, T_K, σ_C and σ_K from the release parameters, unless given
    explicitly (``dprelease account`` with the paper's σ's)."""
    n = int(keys["n"])
    batch, steps = _schedule(keys)
    iterations = keys.get("kmeans_iterations")
    if iterations is None:
        iterations = kmeans_iterations(int(keys["clusters_per_class"]), int(keys["kmeans_refine"]))
    sigma_norm = keys.get("sigma_norm")
    if sigma_norm is None:
        sigma_norm = float(keys["norm_noise"]) * sigma
    sigma_kmeans = keys.get("sigma_kmeans")
    if sigma_kmeans is None:
        sigma_kmeans = kmeans_sigma(
            sigma_sgd=sigma,
            sigma_norm=sigma_norm,
            q=batch / n,
            steps=int(steps),
            iterations=int(iterations),
            share=float(keys["kmeans_share"]),
        )
    return {
        "batch": batch,
        "steps": int(steps),
        "iterations": int(iterations),
        "sigma_norm": float(sigma_norm),
        "sigma_kmeans": float(sigma_kmeans),
    }


def _args(sigma: float, keys: Mapping[str, Any]) -> dict[str, Any]:
    derived = _derived(sigma, keys)
    return {
        "n": keys["n"],
        "batch_size": derived["batch"],
        "sgd_steps": derived["steps"],
        "kmeans_iterations": derived["iterations"],
        "sigma_sgd": sigma,
        "sigma_kmeans": derived["sigma_kmeans"],
        "sigma_norm": derived["sigma_norm"],
        "rbf": _parse_flag(keys["rbf"]),
        "final_counts": True,
    }


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return DPGMEvent(**_args(sigma, keys))


def paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    return DPGMPaperEvent(**_args(sigma, keys), lambda_max=keys["lambda_max"])


def guess_sigma(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    # Large-σ regime of the subsampled Gaussian: μ ≈ 2q√T_S/σ (replace-one), then the
    # classical Gaussian calibration; calibration brackets from here by factors of 4.
    batch, steps = _schedule(keys)
    q = batch / keys["n"]
    mu = epsilon / math.sqrt(2 * math.log(1.25 / delta))
    return max(2 * q * math.sqrt(max(steps, 1)) / mu, 0.5)
