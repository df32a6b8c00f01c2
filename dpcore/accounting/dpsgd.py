"""DP-SGD steps under replace-one neighbours with Poisson sampling: a proven dominating pair.

Used by DPGM's DP-SGD (adaptive clipping included) and ClustMix's DP-KIP; SGDRM's mixtures are
the same pair (``dpcore.mechanisms.sgdrm.accounting_pld``). Replace-one, n public.

Mechanism of one step. Every record joins the step's sample independently with probability
q (Poisson; the replaced record occupies its slot in both datasets, so its inclusion is the
same coin under D and D′). On the sample the step runs k Gaussian releases in sequence,
release j adding N(0, σ_j² I) to Σ_{i in sample} f_j(x_i), where f_j may depend on public
state (earlier steps' outputs) and on this step's earlier releases (DPGM: the clip threshold
C is read from the same batch's noisy histogram), but, for every such state,
    ‖f_j(x)‖ ≤ c_j  (one record present against absent),
    ‖f_j(x) − f_j(x′)‖ ≤ d_j  (one record replaced).
In noise units: a² = Σ_j c_j²/σ_j², Δ² = Σ_j d_j²/σ_j² (d_j ≤ 2c_j always), Δ̄ = max(a, Δ).

Theorem. At every γ > 0 and for both orders of (D, D′), H_γ(step(D) ‖ step(D′)) ≤
H_γ(P* ‖ Q*), where (P*, Q*) is the symmetric pair of ``dpcore.accounting.pld`` with p = q
and distance Δ̄ (there: noise multiplier 1/Δ̄), whose curve at γ ≥ 1 is
H_γ(P*‖Q*) = q·δ_G(Δ̄; log(1 + (γ − 1)/q)), δ_G(μ; ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
Hence T steps chosen adaptively, composed with Gaussian parts that are μ_G-GDP in total,
are dominated by (P*, Q*)^{⊗T} ⊗ (N(0, 1), N(μ_G, 1)) (Zhu, Dong, Wang, AISTATS 2022,
Thm 10), and the pessimistic PLD of that product gives a valid (ε, δ).

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
                  ≤ q·δ_G(Δ̄; log α)                                       (2; δ_G grows with μ)
   = H_γ(P* ‖ Q*). γ < 1: H_γ(P‖Q) = 1 − γ + γ·H_{1/γ}(Q‖P), and the swapped pair (x′, x) meets
   the same bounds; (P*, Q*) satisfies the same identity with its own curve (``pld``, 3–4).
4. Composition: the steps' samples and noises are independent given the public state, the
   pair of step 3 dominates for every state (and every earlier output), and Thm 10 of Zhu,
   Dong, Wang composes dominating pairs adaptively. A μ_G-GDP part is dominated by
   (N(0, 1), N(μ_G, 1)), a symmetric pair.
5. A larger q only loosens the bound (the pair at q is the pair at q′ > q post-processed by
   "with probability 1 − q/q′ replace the sampled component by one drawn from A_∅"), so a
   rate rounded up is safe: ``rate`` rounds L/n up to the next float.

What it does not assume: that antipodal contributions (f(x′) = −f(x), both of full norm) are
the worst case. dp_accounting's ``PoissonSampledDpEvent`` under ``REPLACE_ONE`` is exactly
that antipodal pair; no proof that it dominates every feasible pair is known to us, so it is
kept only as a numerical comparison in the tests (the proven pair lies above it, and above
every feasible pair the tests integrate). Where Δ̄ is twice a (all of the step's releases
antipodal at full norm) the proven pair costs more at large per-step losses: it replaces
H_α(A_x ‖ A_∅) by the larger δ_G(Δ̄) (docs/privacy.md, DPGM, gives the cost in σ).

Numerics (each step only moves the bound up): the T-fold PLD of (P*, Q*) is ``pld``'s
connect-the-dots PMF composed by its FFT; the Gaussian part is dp_accounting's pessimistic
connect-the-dots PLD on the same grid, composed once (``PrivacyLossDistribution.compose``,
truncated mass sent to +∞); ε at δ by ``pld.epsilon_for_delta``.
"""

from __future__ import annotations

import functools
import math
import operator

from dp_accounting.pld import privacy_loss_distribution

from dpcore.accounting import gdp, pld

#: Grid points per noise std of the Gaussian part's loss (μ_G): its single composition adds
#: at most about one interval to ε.
GAUSSIAN_POINTS_PER_MU = 1000


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
    """The composed PLD's grid: ``pld.default_interval`` of the steps, coarsened when the
    Gaussian part (spread μ_G) would need more than GAUSSIAN_POINTS_PER_MU points per μ_G; a
    power of 2^(1/4), as ``pld``'s, so that nearby σ share a grid."""
    h = pld.default_interval(q, 1.0 / step_distance, pld.tail_level(delta, steps))
    coarse = mu / GAUSSIAN_POINTS_PER_MU
    if coarse > h:
        h = float(2.0 ** (math.ceil(4 * math.log2(coarse)) / 4))
    return h


def epsilon(
    *, sampling_prob: float, step_distance: float, steps: int, delta: float, gaussian_mu: float
) -> float:
    """ε at δ of ``steps`` steps dominated by (P*, Q*) (p = ``sampling_prob``, distance
    Δ̄ = ``step_distance``) composed with a μ_G-GDP part (``gaussian_mu``; 0: none)."""
    q, d, T, mu = float(sampling_prob), float(step_distance), operator.index(steps), gaussian_mu
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"gaussian_mu must be finite and >= 0, got {mu!r}")
    if T < 0:
        raise ValueError(f"steps must be >= 0, got {T}")
    if T == 0:
        return gdp.epsilon_of(mu, delta)
    return _epsilon(q, d, T, float(delta), float(mu))


@functools.lru_cache(maxsize=1024)
def _epsilon(q: float, d: float, T: int, delta: float, mu: float) -> float:
    h = _interval(q, d, T, delta, mu)
    composed = pld.composed_pld(q, 1.0 / d, T, delta, value_discretization_interval=h)
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
    """δ(ε) of one step's dominating pair (P*, Q*) at every real ε (the theorem's curve)."""
    return pld.hockey_stick(sampling_prob, 1.0 / step_distance, epsilons)
