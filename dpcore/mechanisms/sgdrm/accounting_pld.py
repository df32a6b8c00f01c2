"""SGDRM (clipped coefficients): a PROVEN dominating pair, its PLD and its RDP curve.

Mechanism (``generate.py``): in mixture t record i enters with b ~ Bern(q) (q = ℓ/n, Poisson)
and coefficient g clipped to [−c, c]; the mixture releases Σ_i b_i g_i (x_i, y_i) + N(0, σ² I).
Preprocessed records have features in [0, 1]^d with ‖x‖ ≤ 1 and one-hot labels.
Replace-one, n public.

Derivation (every step valid for composition; no numerical assumption)
----------------------------------------------------------------------
1. Reveal every coefficient g_{t,j} and every other record's b_{t,j}: their law does not
   depend on the data, so by joint convexity of the hockey-stick divergence H_γ a pair that
   dominates every conditional pair dominates the release. Record i's b is the SAME draw in D
   and D′ (the replaced record occupies its slot). Given the rest, in noise units (divide by
   σ) one mixture is the pair
       P_u = (1 − q)N_s + qN_{s+u},   P_u′ = (1 − q)N_s + qN_{s+u′},
   u = g(x, y)/σ, u′ = g(x′, y′)/σ. Non-negative features and one-hot labels give
   ‖(x, y) − (x′, y′)‖² ≤ 2 + 2, so ‖u − u′‖ ≤ 2c/σ =: Δ, and ‖u‖, ‖u′‖ ≤ √2c/σ ≤ Δ.
2. For γ = α′ ≥ 1, α = 1 + (α′ − 1)/q, β = α′/α (Balle, Barthe, Gaboardi 2018, Thm 2: an
   identity for any three distributions, here with the common Bernoulli of record i):
       H_α′(P_u ‖ P_u′) = q·H_α(N_u ‖ (1 − β)N_0 + βN_u′)
                        ≤ q·[(1 − β)H_α(N_u ‖ N_0) + βH_α(N_u ‖ N_u′)] ≤ q·δ_G(Δ; log α),
   by convexity of H_α in its second argument and because the Gaussian curve δ_G(d; ·)
   (Balle–Wang 2018) grows with the distance d. For γ < 1 use H_γ(P‖Q) = 1 − γ + γH_{1/γ}(Q‖P)
   and the same bound for (u′, u), which meets the same constraints.
3. That is exactly the curve of the symmetric pair (P*, Q*) of one mixture
   (``dpcore.accounting.pld``, docstring 2–4) with p = q and Δ = 2c/σ: it
   dominates one mixture at every γ > 0 and both orders, so its T-fold product dominates the
   release (Zhu, Dong, Wang 2022, Thm 10). The PLD is that module's pessimistic
   connect-the-dots PMF composed by its FFT (its numerics and their tests are reused as is).
4. RDP. A pair that dominates in every H_γ dominates in every f-divergence
   (D_f(P‖Q) = ∫ f″(γ)[H_γ(P‖Q) − (1 − γ)_+] dγ), so D_α of one mixture is at most
   D_α(P*‖Q*), and T mixtures add (adaptive RDP composition; the conditioning of step 1 is
   again joint convexity of e^{(α−1)D_α}). ``rdp_curve`` evaluates D_α(P*‖Q*) (below).
5. Inclusion. The generator includes a record when a uniform float64 on the 2⁻⁵³ grid is
   below q, i.e. with probability ⌈q·2⁵³⌉·2⁻⁵³ ≤ q + 2⁻⁵³; the bounds here use
   q⁺ = q + 2⁻⁵² (``inclusion_probability``), which covers any uniform on a grid of step
   ≤ 2⁻⁵². Larger q only loosens the bound: the pair at q is the pair at q⁺ post-processed
   by "with probability 1 − q/q⁺ replace the output by a fresh draw of N_s".

What this does NOT use: that the two contributions cannot be antipodal beyond step 1's
‖u − u′‖ ≤ 2c/σ. Where ‖u‖ (≤ √2c/σ) is much smaller than Δ the bound is loose: step 2
replaces H_α(N_u‖N_0) (distance ≤ √2c) by δ_G(2c). dp_accounting's antipodal REPLACE_ONE
pair of radius √2c (``accounting.replace_one_epsilon``) is smaller in the large-loss regime
but its domination of non-antipodal pairs is not proved (numerical checks only), so the
event charges this pair alone (``accounting``). ``dpcore.accounting.dpsgd`` states the same
theorem for DP-SGD steps (DPGM, DP-KIP).

RDP of (P*, Q*) at integer α ≥ 2 (whitened, M = (1 − q)N_0 + qN_Δ, m(x) = dM/dN_0(x) =
1 + t(x), t = q(e^{Δx − Δ²/2} − 1) ≥ 0 on x ≥ Δ/2, A = Φ̄(Δ/2)). From ω*'s definition
(positive part ω on l > 0, its tilted mirror, the atom (1 − q)(1 − 2A) at 0):
    E_{P*}[e^{(α−1)L}] = ∫_{x>Δ/2} m^α φ + ∫_{x>Δ/2} m^{1−α} φ + (1 − q)(1 − 2A)
                       = S + 1 − A − αq(1 − 2A) + B,
    S = Σ_k C(α, k)(1 − q)^{α−k} q^k e^{k(k−1)Δ²/2} Φ̄(Δ/2 − kΔ)   (exact, positive terms),
    B = ∫_{x>Δ/2} [(1 + t)^{1−α} − 1 + (α − 1)t] φ
      ≤ min( C(α, 2)·I₂, (α − 1)q(1 − 2A), an upper Riemann sum ),   I₂ = ∫_{x>Δ/2} t² φ
        = q²[e^{Δ²}Φ(3Δ/2) − 2Φ(Δ/2) + A]
   (Taylor with a negative third derivative; and (1 + t)^{1−α} ≤ 1). The sum is formed with
   math.fsum and raised by 1e-13 of the sum of its terms' magnitudes (float rounding of
   the terms), so the curve is an upper bound. Fractional orders: (α − 1)D_α is convex in α
   (a log-moment generating function), so linear interpolation between the neighbouring
   integer orders (and from (1, 0) below 2) bounds it from above.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from dpcore.accounting import pld
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp

#: Added to the nominal inclusion probability (derivation, 5).
INCLUSION_SLACK = 2.0**-52
#: Relative allowance for float rounding of the RDP sum's terms (derivation, RDP).
RDP_ROUNDING = 1e-13


def inclusion_probability(n: int, mixture_width: int) -> float:
    """q⁺: an upper bound on the generator's inclusion probability ℓ/n (derivation, 5)."""
    return min(1.0, mixture_width / n + INCLUSION_SLACK)


def sensitivity(sigma: float, coefficient_bound: float) -> float:
    """Δ = 2c/σ: the most two replaced contributions differ, in noise units (derivation, 1)."""
    return 2.0 * coefficient_bound / sigma


def pld_epsilon(q: float, delta_norm: float, T: int, delta: float) -> float:
    """ε at δ of T mixtures by the proven pair's pessimistic PLD (derivation, 3)."""
    return pld.epsilon_of(q, 1.0 / delta_norm, T, delta)


def _integer_order_log_moment(alpha: int, q: float, d: float) -> float:
    """log E_{P*}[e^{(α−1)L}] (an upper bound) of one mixture at integer α ≥ 2."""
    k = np.arange(alpha + 1, dtype=np.float64)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
    log_rest = math.log1p(-q) if q < 1 else -math.inf
    rest = np.where(k < alpha, (alpha - k) * log_rest if q < 1 else -np.inf, 0.0)
    log_q_part = k * math.log(q) + rest
    log_terms = log_binom + log_q_part + k * (k - 1) * d * d / 2 + special.log_ndtr(k * d - d / 2)
    a = float(special.ndtr(-d / 2))
    # e^{Δ²} overflows for the tiny σ calibration may probe: B's first bound is then +inf and
    # its second, finite one decides.
    exp_dd = math.exp(d * d) if d * d < 700 else math.inf
    i2 = q * q * (exp_dd * special.ndtr(1.5 * d) - 2 * special.ndtr(d / 2) + a)
    i2 = max(i2, 0.0) + 4e-16 * q * q * (exp_dd + 3)
    b = min(alpha * (alpha - 1) / 2 * i2, (alpha - 1) * q * (1 - 2 * a))
    top = float(np.max(log_terms))
    if top <= 30:  # only there does B matter against S
        b = min(b, _b_riemann(alpha, q, d))
    if top > 30:
        # S dominates: E ≤ S + 1 + B (the dropped terms are ≤ 0).
        log_s = float(special.logsumexp(log_terms))
        return log_s + math.log1p((1 + b) * math.exp(-log_s)) + RDP_ROUNDING
    terms = np.exp(log_terms)
    parts = [*terms.tolist(), -a, -alpha * q * (1 - 2 * a), b]
    excess = math.fsum(parts) + RDP_ROUNDING * math.fsum(abs(v) for v in parts)
    return math.log1p(max(excess, 0.0))


#: Cells of the upper Riemann sum of B, on [Δ/2, Δ/2 + B_SPAN].
B_CELLS = 5_000
B_SPAN = 40.0


def _b_riemann(alpha: int, q: float, d: float) -> float:
    """An upper bound on B = ∫_{x>Δ/2} h(t(x)) φ(x) dx, h(t) = (1 + t)^{1−α} − 1 + (α − 1)t.

    h is increasing in t ≥ 0 and t increasing in x, while φ decreases on x > 0: on each cell
    the integrand is at most h at the cell's right end times φ's exact mass of the cell (an
    upper Riemann sum; numpy's own quadrature would give no one-sided guarantee). Beyond the
    last cell h ≤ (α − 1)t ≤ (α − 1)q·e^{Δx − Δ²/2}, whose integral is closed form."""
    m = alpha - 1
    edges = d / 2 + np.linspace(0.0, B_SPAN, B_CELLS + 1)
    t = q * np.expm1(np.minimum(d * edges[1:] - d * d / 2, 700.0))
    with np.errstate(over="ignore", invalid="ignore"):
        direct = np.expm1(-m * np.log1p(t)) + m * t
    # Small t: the Taylor bound m(m + 1)t²/2 (third derivative < 0) avoids the cancellation.
    h = np.where(t < 1e-4, m * (m + 1) / 2 * t * t, direct * (1 + 1e-12) + 1e-300)
    mass = np.diff(special.ndtr(edges))
    tail = m * q * float(special.ndtr(d - edges[-1]))
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.sum(np.where(mass > 0, h * mass, 0.0)))
    return total * (1 + 1e-12) + tail


@functools.lru_cache(maxsize=256)
def rdp_curve(q: float, delta_norm: float, T: int) -> tuple[float, ...]:
    """T·D_α(P*‖Q*) on ``ORDERS`` (derivation, 4 and the RDP paragraph)."""
    integer_orders = sorted({int(a) for a in ORDERS if a >= 2} | {math.ceil(a) for a in ORDERS})
    log_moment: dict[int, float] = {1: 0.0}
    for alpha in integer_orders:
        log_moment[alpha] = _integer_order_log_moment(alpha, q, delta_norm)
    curve = []
    for order in ORDERS:
        lo, hi = math.floor(order), math.ceil(order)
        if lo == hi:
            value = log_moment[lo]
        else:  # (α − 1)D_α is convex: the chord between lo and hi lies above it.
            w = order - lo
            value = (1 - w) * log_moment[lo] + w * log_moment[hi]
        curve.append(T * value / (order - 1))
    return tuple(curve)


def rdp_epsilon(q: float, delta_norm: float, T: int, delta: float) -> float:
    """ε at δ from ``rdp_curve`` (dp_accounting's conversion)."""
    return epsilon_from_rdp(rdp_curve(q, delta_norm, T), delta=delta)
