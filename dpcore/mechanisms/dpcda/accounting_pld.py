"""DP-CDA's privacy loss distributions: the two cases of ``accounting``'s replace-one argument
as dominating pairs at every α > 0 (hockey-stick divergences), composed exactly by PLD.

Write p = ℓ/m (≥ ℓ/N_c for every class c), Δ = 1/z = R/(σℓ) (R the record distance of
``accounting``), T_c = ⌈T/K⌉, M = (1 − p)·N(0, 1) + p·N(Δ, 1) and N₀ = N(0, 1).

(a) The replaced record stays in class c (N_c is the same in both datasets): the class's
    T_c mixtures are T_c independent means of uniform ℓ-subsets without replacement of N_c
    records, each dominated at every α by ``dpcore.accounting.pld.mixture_pmf`` at
    p_c = ℓ/N_c (its derivation: BBG's coupling, advanced joint convexity, Dong–Roth–Su's
    min{f_p, f_p⁻¹}**). That pair at p dominates the one at any p′ ≤ p: its trade-off
    curve f_p = p·G_Δ + (1 − p)·Id decreases pointwise in p (G_Δ ≤ Id), and inversion,
    minimum and double conjugation keep the order. The other classes' mixtures have the
    same law in both datasets. So case (a) ≤ T_c-fold (P*, Q*) at p = ℓ/m.
(b) The record moves from class a to class b: class a loses it, class b gains one (another
    record x′). Conditioned on the coupling of ``accounting`` (draw a uniform ℓ-subset of the
    smaller class, then replace a uniform member by the extra record with probability
    q′ = ℓ/(N + 1)), a mixture of the larger class is (1 − q′)·N_μ + q′·N_{μ+v} against N_μ
    for the smaller, ‖v‖ ≤ Δ (whitened). Hockey-stick divergences are jointly convex, so at
    every α the unconditional pair is within the worst conditional one; along v a shift
    shorter than Δ is the Δ-pair with extra Gaussian noise after rescaling (post-processing),
    and a smaller q′ is the mixture (1 − q′/p)·N₀ + (q′/p)·M against N₀, within the p-pair
    by joint convexity (H_α(N₀‖N₀) = (1 − α)_+ ≤ H_α(N₀‖M), both orders alike). So class a's
    T_c mixtures are dominated by (M, N₀) each and class b's by (N₀, M) each, both at
    p = ℓ/m, and the classes' mixtures are independent given the data: the release is
    dominated by the product (M × N₀, N₀ × M)^{⊗T_c}. The other order of the datasets gives
    (N₀ × M, M × N₀)^{⊗T_c}, the same pair with coordinates swapped: one symmetric PLD,
    the convolution of the remove pair's and the add pair's, composed T_c times. Absent
    when K = 1.

Every neighbouring pair falls in one case and composes within it, so the release's δ(ε) is at
most max(δ_a(ε), δ_b(ε)), and its ε at δ is max(ε_a(δ), ε_b(δ)). Numerics: the shared
connect-the-dots PMFs (``mixture_pmf``, ``poisson_pmf``, ``reverse``), ``convolve`` and the
precise FFT ``compose`` of ``dpcore.accounting.pld``; every step only moves the bound up.
"""

from __future__ import annotations

import functools
import math
import operator

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dpcore.accounting.pld import (
    compose,
    composed_pld,
    convolve,
    default_interval,
    epsilon_for_delta,
    mixture_pmf,
    poisson_pmf,
    reverse,
    tail_level,
)


def _checked(n_steps: int, delta: float) -> int:
    T = operator.index(n_steps)
    if T < 1:
        raise ValueError(f"the number of mixtures per class must be >= 1, got {n_steps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return T


def stay_pld(
    sampling_prob: float, noise_multiplier: float, per_class: int, delta: float
) -> PrivacyLossDistribution:
    """Case (a): T_c mixtures of one class, the symmetric WOR pair at p (cached there)."""
    T = _checked(per_class, delta)
    return composed_pld(sampling_prob, noise_multiplier, T, delta)


@functools.lru_cache(maxsize=16)
def _move(p: float, z: float, T: int, interval: float, tail: float) -> PrivacyLossDistribution:
    remove = poisson_pmf(p, z, interval, tail)
    return compose(convolve(remove, reverse(remove)), T)


def move_pld(
    sampling_prob: float, noise_multiplier: float, per_class: int, delta: float
) -> PrivacyLossDistribution:
    """Case (b): T_c independent copies of (M × N₀, N₀ × M): one class loses the record, the
    other gains one. The one-step grid is the WOR pair's (the same spread per side)."""
    T = _checked(per_class, delta)
    tail = tail_level(delta, T)
    interval = default_interval(sampling_prob, noise_multiplier, tail)
    return _move(float(sampling_prob), float(noise_multiplier), T, interval, tail)


def epsilons(
    sampling_prob: float, noise_multiplier: float, per_class: int, n_classes: int, delta: float
) -> tuple[float, float]:
    """(ε_a, ε_b) at δ; ε_b is 0 when K = 1 (no class to move to)."""
    stay = stay_pld(sampling_prob, noise_multiplier, per_class, delta)
    eps_a = float(epsilon_for_delta(stay, delta))
    if n_classes == 1:
        return eps_a, 0.0
    move = move_pld(sampling_prob, noise_multiplier, per_class, delta)
    return eps_a, float(epsilon_for_delta(move, delta))


def _degenerate(pld: PrivacyLossDistribution) -> bool:
    """All mass at +∞ (one mixture's loss past MAX_LOSS): no finite ε, and dp_accounting's
    composition cannot take the empty PMF."""
    return pld.get_delta_for_epsilon(1e300) >= 1.0


def epsilons_after_gaussian(
    sampling_prob: float,
    noise_multiplier: float,
    per_class: int,
    n_classes: int,
    mu: float,
    delta: float,
) -> tuple[float, float]:
    """(ε_a, ε_b) at δ when a μ-GDP Gaussian step (DP standardisation statistics) runs
    first: each case's PLD composed with the Gaussian pair's (adaptive composition: the
    mixing's dominating pair does not depend on the statistics released)."""
    T = _checked(per_class, delta)
    tail = tail_level(delta, T)
    h = default_interval(sampling_prob, noise_multiplier, tail)
    # The Gaussian pair is the WOR pair at p = 1 (no atom), on the cases' grid.
    gauss = mixture_pmf(1.0, 1.0 / mu, h, tail).pld()
    if _degenerate(stay_pld(sampling_prob, noise_multiplier, T, delta)):
        return math.inf, math.inf
    stay = stay_pld(sampling_prob, noise_multiplier, T, delta).compose(gauss)
    eps_a = float(epsilon_for_delta(stay, delta))
    if n_classes == 1:
        return eps_a, 0.0
    move = move_pld(sampling_prob, noise_multiplier, T, delta).compose(gauss)
    return eps_a, float(epsilon_for_delta(move, delta))
