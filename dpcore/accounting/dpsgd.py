"""DP-SGD steps under replace-one neighbours with Poisson sampling: a proven dominating pair.

Used by DPGM's DP-SGD (adaptive clipping included), ClustMix's DP-KIP and SGDRM's mixtures
(whose (P*, Q*) is ``dpcore.mechanisms.sgdrm.accounting_pld``). Replace-one, n public.

Mechanism of one step. Every record joins the step's sample independently with probability
q (Poisson; the replaced record occupies its slot in both datasets, so its inclusion is the
same coin under D and D′). On the sample the step runs k Gaussian releases in sequence,
release j adding N(0, σ_j² I) to Σ_{i in sample} f_j(x_i), where f_j may depend on public
state (earlier steps' outputs) and on this step's earlier releases (DPGM: the clip threshold
C is read from the same batch's noisy histogram), but, for every such state,
    ‖f_j(x)‖ ≤ c_j  (one record present against absent),
    ‖f_j(x) − f_j(x′)‖ ≤ d_j  (one record replaced).
In noise units: a² = Σ_j c_j²/σ_j², Δ² = Σ_j d_j²/σ_j² (d_j ≤ 2c_j always), Δ̄ = max(a, Δ).

Theorem. Let B(γ) = q·[(1 − β)·δ_G(a; log α) + β·δ_G(Δ; log α)] for γ ≥ 1, α = 1 + (γ − 1)/q,
β = γ/α, δ_G(μ; ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). (i) At every γ ≥ 1 and for both
orders of (D, D′), H_γ(step(D) ‖ step(D′)) ≤ B(γ) ≤ q·δ_G(Δ̄; log α) = H_γ(P* ‖ Q*), (P*, Q*)
the symmetric pair of ``dpcore.accounting.pld`` with p = q and distance Δ̄ (there: noise
multiplier 1/Δ̄). (ii) Hence (P*, Q*) dominates one step at every γ > 0, and so does the
two-term pair D_h built from B on a grid of losses kh (``two_term_pmf``, "Tighter pair"
below) whenever its masses are non-negative (checked when it is built; otherwise (P*, Q*) is
used). (iii) T steps chosen adaptively, composed with Gaussian parts that are μ_G-GDP in
total, are dominated by the T-fold product of the step's pair ⊗ (N(0, 1), N(μ_G, 1)) (Zhu,
Dong, Wang, AISTATS 2022, Thm 10), and the pessimistic PLD of that product gives a valid
(ε, δ).

Proof.
1. Condition on every other record's inclusion coin (their law does not depend on the data).
   The hockey-stick divergence is jointly convex, so a pair that dominates every conditional
   pair at γ dominates the step at γ. Given the coins, the step's outputs are distributed as
       P = (1 − q)·A_∅ + q·A_x   under D,      Q = (1 − q)·A_∅ + q·A_x′   under D′,
   A_v the law of the k releases when the record's slot holds v (∅: not sampled).
2. A_x against A_∅ is an adaptive composition of k Gaussian mechanisms: given the earlier
   releases (the others' sums are then fixed), release j is N(s_j + f_j(x), σ_j²I) against
   N(s_j, σ_j²I), whose trade-off function is ≥ G_{c_j/σ_j} whatever f_j read before. GDP
   composes adaptively (Dong, Roth, Su, JRSS-B 2022, Thm 3.2 and Cor. 3.3, applied to this
   one pair of inputs), so T(A_x, A_∅) ≥ G_a, i.e. H_α(A_x ‖ A_∅) ≤ δ_G(a; log α) for every
   α ≥ 1; likewise H_α(A_x ‖ A_x′) ≤ δ_G(Δ; log α). This is where the adaptive clip is
   covered: the histogram and the gradient sum are two releases of one composition, the
   second's clip chosen from the first, each bounded for every choice.
3. γ ≥ 1: Balle, Barthe, Gaboardi (NeurIPS 2018, Thm 2, advanced joint convexity; an identity
   for mixtures with a common component), with α = 1 + (γ − 1)/q and β = γ/α ∈ (0, 1]:
       H_γ(P ‖ Q) = q·H_α(A_x ‖ (1 − β)A_∅ + βA_x′)
                  ≤ q·[(1 − β)·H_α(A_x ‖ A_∅) + β·H_α(A_x ‖ A_x′)]     (convexity)
                  ≤ B(γ)                                                  (2)
                  ≤ q·δ_G(Δ̄; log α) = H_γ(P* ‖ Q*)                       (δ_G grows with μ).
   γ < 1: H_γ(P‖Q) = 1 − γ + γ·H_{1/γ}(Q‖P), and the swapped pair (x′, x) meets the same
   bounds; (P*, Q*) satisfies the same identity with its own curve (``pld``, 3–4).
4. Composition: the steps' samples and noises are independent given the public state, the
   pair of step 3 dominates for every state (and every earlier output), and Thm 10 of Zhu,
   Dong, Wang composes dominating pairs adaptively. A μ_G-GDP part is dominated by
   (N(0, 1), N(μ_G, 1)), a symmetric pair.
5. A larger q only loosens the bound (the pair at q is the pair at q′ > q post-processed by
   "with probability 1 − q/q′ replace the sampled component by one drawn from A_∅"), so a
   rate rounded up is safe: ``rate`` rounds L/n up to the next float.

Tighter pair (``two_term_pmf``). On the grid l_k = kh, 0 ≤ k ≤ K, with γ_k = e^{l_k}, put
P-mass ω_k at l_k (k ≥ 1) with ω_k·e^{−l_k} = s_k − s_{k−1} (s_k the slope of B's grid values
on [γ_k, γ_{k+1}], s_K = 0), mass ω_∞ = B(γ_K) at +∞, the mirror e^{−l_k}·ω_k at −l_k and the
rest at 0: a symmetric pair (−L under Q has the law of L under P) whenever every mass is ≥ 0,
which the code checks. Its curve D_h(γ) = Σ_k ω_k(1 − γe^{−l_k})_+ + ω_∞ is linear between
the γ_k, equal to B(γ_k) at each of them, and constant ω_∞ beyond γ_K. Every step's curve h
(both orders) is convex and non-increasing in γ with h(γ_k) ≤ B(γ_k) (i), so h lies below the
chords, h ≤ D_h on [1, γ_K], and h(γ) ≤ h(γ_K) ≤ ω_∞ beyond; for γ < 1 both sides satisfy
H_γ = 1 − γ + γ·H_{1/γ}(swapped), and the swapped step meets the same bounds. So D_h dominates
the step at every γ > 0, with no assumption on B itself. K is where (P*, Q*)'s curve falls
below ``pld.tail_level`` (B lies below it). Grid values are raised by a relative
``CURVE_ROUNDING`` for float rounding, as ``pld``'s numerics allow for theirs.

What it does not assume: that antipodal contributions (f(x′) = −f(x), both of full norm) are
the worst case. dp_accounting's ``PoissonSampledDpEvent`` under ``REPLACE_ONE`` is exactly
that antipodal pair; no proof that it dominates every feasible pair is known to us, so it is
kept only as a numerical comparison in the tests (the charged pair lies above it, and above
every feasible pair the tests integrate). B keeps the presence bound a in its first term; the
simpler (P*, Q*) replaces it by Δ̄ ≈ 2a and costs much more at moderate noise (at the paper's
DPGM setting ε 3.13 against B's 1.82; the antipodal pair gives 1.64: docs/privacy.md, DPGM).

Numerics (each step only moves the bound up): the step's PMF (the two-term pair, else
``pld``'s connect-the-dots PMF of (P*, Q*)) composed T times by ``pld.compose`` (FFT); the
Gaussian part is dp_accounting's pessimistic connect-the-dots PLD on the same grid, composed
once (``PrivacyLossDistribution.compose``, truncated mass sent to +∞); ε at δ by
``pld.epsilon_for_delta``.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from scipy import special

from dpcore.accounting import gdp, pld

#: Grid points per noise std of the Gaussian part's loss (μ_G): its single composition adds
#: at most about one interval to ε.
GAUSSIAN_POINTS_PER_MU = 1000
#: Relative allowance added to B's grid values for float rounding (as ``pld``'s numerics).
CURVE_ROUNDING = 1e-12


def rate(batch: int, n: int) -> float:
    """q⁺ ≥ L/n: the exact Poisson rate rounded up to a float (proof, 5)."""
    batch, n = operator.index(batch), operator.index(n)
    if not 0 < batch <= n:
        raise ValueError(f"need 0 < batch <= n, got batch={batch}, n={n}")
    q = batch / n
    return 1.0 if batch == n else min(1.0, math.nextafter(q, math.inf))


def distance(present: float, replaced: float) -> float:
    """Δ̄ = max(a, Δ): the pair's distance from the step's two whitened bounds (docstring)."""
    for name, value in (("present", present), ("replaced", replaced)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return max(float(present), float(replaced))


def _interval(q: float, step_distance: float, steps: int, delta: float, mu: float) -> float:
    """The composed PLD's grid: ``pld.default_interval`` of (P*, Q*) (whose spread is at least
    the two-term pair's), coarsened when the Gaussian part (spread μ_G) would need more than
    GAUSSIAN_POINTS_PER_MU points per μ_G; a power of 2^(1/4), as ``pld``'s, so that nearby σ
    share a grid."""
    h = pld.default_interval(q, 1.0 / step_distance, pld.tail_level(delta, steps))
    coarse = mu / GAUSSIAN_POINTS_PER_MU
    if coarse > h:
        h = float(2.0 ** (math.ceil(4 * math.log2(coarse)) / 4))
    return h


def _gaussian_curve(mu: float, alpha: np.ndarray) -> np.ndarray:
    """δ_G(μ; log α) = Φ(−log α/μ + μ/2) − α·Φ(−log α/μ − μ/2), α ≥ 1, in log space."""
    log_alpha = np.log(alpha)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_a = special.log_ndtr(-log_alpha / mu + mu / 2)
        log_b = log_alpha + special.log_ndtr(-log_alpha / mu - mu / 2)
        return np.exp(log_a) * -np.expm1(np.minimum(log_b - log_a, 0.0))  # type: ignore[no-any-return]


def step_curve(sampling_prob: float, present: float, replaced: float, epsilons: Any) -> np.ndarray:
    """B(e^ε) for ε ≥ 0 (proof, 3): q·[(1 − β)·δ_G(a; log α) + β·δ_G(Δ; log α)], α = 1 +
    (e^ε − 1)/q, β = e^ε/α — the bound on every feasible step's H_{e^ε} before its last,
    looser step q·δ_G(Δ̄; log α)."""
    q = float(sampling_prob)
    eps = np.asarray(epsilons, dtype=np.float64)
    with np.errstate(over="ignore"):
        alpha = 1.0 + np.expm1(eps) / q
        beta = np.where(np.isfinite(alpha), np.exp(eps - np.log(alpha)), q)
    return q * (
        (1.0 - beta) * _gaussian_curve(present, alpha) + beta * _gaussian_curve(replaced, alpha)
    )  # type: ignore[no-any-return]


def two_term_pmf(
    sampling_prob: float, present: float, replaced: float, interval: float, tail: float
) -> pld.DiscretePLD | None:
    """The symmetric discrete pair whose hockey-stick curve interpolates B (``step_curve``)
    linearly in e^ε between the grid losses kh, 0 ≤ k ≤ K (module docstring, "Tighter
    pair"); None when the grid values are not convex in e^ε (some mass would be negative)."""
    q, a, d = float(sampling_prob), float(present), float(replaced)
    h = float(interval)
    top = pld.loss_top(q, 1.0 / max(a, d), tail)  # B ≤ (P*, Q*)'s curve ≤ tail beyond
    K = max(math.ceil(top / h), 1)
    losses = np.arange(K + 1, dtype=np.float64) * h
    values = step_curve(q, a, d, losses) * (1 + CURVE_ROUNDING)
    gammas = np.exp(losses)
    slopes = np.diff(values) / np.diff(gammas)  # s_k on [γ_k, γ_{k+1}], k < K
    # Mass at loss l_k (k ≥ 1) times e^{−l_k}: the slope's increase at γ_k (0 right of γ_K).
    tilted = np.diff(np.concatenate((slopes, [0.0])))
    if not (np.all(np.isfinite(tilted)) and np.all(tilted >= 0)):
        return None
    mass = tilted * gammas[1:]  # P-mass at l_1 … l_K
    infinity = float(values[-1])
    atom = 1.0 - infinity - math.fsum(mass) - math.fsum(tilted)
    if not (math.isfinite(atom) and atom >= 0):
        return None
    probs = np.zeros(2 * K + 1)  # index i ↔ loss (i − K)·h
    probs[K + 1 :] = mass
    probs[:K] = tilted[::-1]  # the mirror: P-mass e^{−l}·ω at −l
    probs[K] = atom
    return pld.DiscretePLD(probs, -K, infinity, h)


def epsilon(
    *,
    sampling_prob: float,
    present: float,
    replaced: float,
    steps: int,
    delta: float,
    gaussian_mu: float,
) -> float:
    """ε at δ of ``steps`` steps (rate q = ``sampling_prob``, whitened presence bound
    a = ``present``, replacement bound Δ = ``replaced``) composed with a μ_G-GDP part
    (``gaussian_mu``; 0: none): the two-term pair, or (P*, Q*) of distance Δ̄ where that pair
    cannot be built."""
    q, T, mu = float(sampling_prob), operator.index(steps), gaussian_mu
    if not 0 < q <= 1:
        raise ValueError(f"sampling_prob must be in (0, 1], got {sampling_prob!r}")
    d_bar = distance(present, replaced)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"gaussian_mu must be finite and >= 0, got {mu!r}")
    if T < 0:
        raise ValueError(f"steps must be >= 0, got {T}")
    if T == 0:
        return gdp.epsilon_of(mu, delta)
    return _epsilon(q, float(present), float(replaced), d_bar, T, float(delta), float(mu))


@functools.lru_cache(maxsize=1024)
def _epsilon(q: float, a: float, d: float, d_bar: float, T: int, delta: float, mu: float) -> float:
    h = _interval(q, d_bar, T, delta, mu)
    tail = pld.tail_level(delta, T)
    step = two_term_pmf(q, a, d, h, tail)
    if step is None:
        step = pld.mixture_pmf(q, 1.0 / d_bar, h, tail)
    composed = pld.compose(step, T)
    if mu > 0:
        gaussian = privacy_loss_distribution.from_gaussian_mechanism(
            1.0,
            sensitivity=mu,
            pessimistic_estimate=True,
            value_discretization_interval=h,
            use_connect_dots=True,
        )
        composed = composed.compose(gaussian)
    return pld.epsilon_for_delta(composed, delta)


def step_hockey_stick(sampling_prob: float, step_distance: float, epsilons: object) -> object:
    """δ(ε) of (P*, Q*) of distance Δ̄ at every real ε (the theorem's simpler pair)."""
    return pld.hockey_stick(sampling_prob, 1.0 / step_distance, epsilons)
