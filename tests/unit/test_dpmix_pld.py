"""dpcore.mechanisms.dpmix.accounting_pld: the DPMix PLD accountant (mixture assignment).

Its ε is checked against values computed without it:
- a realisable lower bound: every other record equal to the replaced record's neighbour, so
  T mixtures are exactly T i.i.d. copies of the pair (M, N(0, 1)),
  M = (1 − p)N(0, 1) + pN(Δ, 1), in one of the two orders. Its ε is computed exactly for
  T = 1 (closed form, mpmath) and T = 2 (one-dimensional quadrature, mpmath), and bounded
  from below for large T by dp_accounting's optimistic PLD of the same pair (its
  add/remove Poisson-subsampled Gaussian, privacy buckets rounding down);
- the real mechanism on small datasets (n ≤ 7, exact output laws: a mixture of the C(n, ℓ)
  subset means plus noise), one and two mixtures, including datasets whose mixtures lean
  both ways: never above the bound;
- the RDP accountant (``DPMixEvent``): the PLD is never worse;
- direct numerical integration of the dominating pair's hockey-stick divergence;
- dp_accounting's own connect-the-dots PMF and its ``self_compose`` (long double).
"""

from __future__ import annotations

import itertools
import math
import time

import mpmath as mp
import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pldm
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import integrate
from scipy.optimize import brentq
from scipy.stats import norm

from dpcore.accounting.composition import Cost
from dpcore.mechanisms.dpmix import accounting_pld as pld
from dpcore.mechanisms.dpmix.accounting import DPMixEvent, DPMixRecordEvent, _mixing_noise
from dpcore.mechanisms.dpmix.accounting import calibrate as rdp_calibrate
from dpcore.mechanisms.dpmix.accounting_pld import DPMixPLDEvent

DELTA = 1e-5
# (p, z): MNIST at the PLD's ε = 1 (n = 10⁴, ℓ = 64, σ = 0.0872), a small noise
# multiplier, a large sampling ratio, no subsampling, and n = 10⁶.
PAIRS = [(64 / 10_000, 2.79), (8 / 10_000, 0.42), (0.5, 1.3), (1.0, 2.0), (64 / 10**6, 0.69)]


def joint_z(sigma_x: float, sigma_y: float, ell: int) -> float:
    """z = (1/z_x² + 1/z_y²)^(−1/2), z_· = σ_·ℓ/√2, computed here from the definition."""
    return 1 / math.sqrt(2 / (sigma_x * ell) ** 2 + 2 / (sigma_y * ell) ** 2)


# --- the realisable lower bound, exactly (mpmath) -------------------------------------------


def h_mix_normal(p: float, z: float, eps: mp.mpf) -> mp.mpf:
    """H_{e^ε}(M ‖ N(0, 1)) at any real ε: M > αN₀ exactly where x > x*."""
    d, alpha = 1 / mp.mpf(z), mp.e**eps
    if alpha <= 1 - p:
        return 1 - alpha
    x = (mp.log((alpha - 1 + p) / p) + d * d / 2) / d
    return (1 - p) * mp.ncdf(-x) + p * mp.ncdf(d - x) - alpha * mp.ncdf(-x)


def h_normal_mix(p: float, z: float, eps: mp.mpf) -> mp.mpf:
    """H_{e^ε}(N(0, 1) ‖ M) at any real ε: N₀ > βM exactly where x < x* (if anywhere)."""
    d, beta = 1 / mp.mpf(z), mp.e**eps
    if 1 / beta <= 1 - p:
        return mp.mpf(0)
    x = (mp.log((1 / beta - 1 + p) / p) + d * d / 2) / d
    return mp.ncdf(x) - beta * ((1 - p) * mp.ncdf(x) + p * mp.ncdf(x - d))


def exact_lower_bound_delta(p: float, z: float, T: int, eps: float) -> mp.mpf:
    """δ(ε) of the realisable pair over T = 1 or 2 mixtures, the larger of the two orders
    (T = 2: condition on the first mixture's output x, integrate over x)."""
    with mp.workdps(30):
        eps_ = mp.mpf(eps)
        if T == 1:
            return max(h_mix_normal(p, z, eps_), h_normal_mix(p, z, eps_))
        assert T == 2
        d = 1 / mp.mpf(z)

        def loss(x: mp.mpf) -> mp.mpf:  # log(dM/dN₀)(x)
            return mp.log(1 - p + p * mp.exp(d * x - d * d / 2))

        def density_m(x: mp.mpf) -> mp.mpf:
            return (1 - p) * mp.npdf(x) + p * mp.npdf(x, d)

        cuts = [-14, -4, 0, d / 2, d, 4 + d, 14 + d]
        remove = mp.quad(lambda x: density_m(x) * h_mix_normal(p, z, eps_ - loss(x)), cuts)
        add = mp.quad(lambda x: mp.npdf(x) * h_normal_mix(p, z, eps_ + loss(x)), cuts)
        return max(remove, add)


def exact_epsilon_t1(p: float, z: float, delta: float) -> float:
    """The realisable pair's exact ε at δ for one mixture (bisection on the exact δ)."""
    lo, hi = 0.0, 1.0
    while exact_lower_bound_delta(p, z, 1, hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if exact_lower_bound_delta(p, z, 1, mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return hi


def optimistic_lower_bound_epsilon(p: float, z: float, T: int, delta: float, h: float) -> float:
    """A lower bound on the realisable pair's ε over T mixtures: dp_accounting's PLD of the
    add/remove Poisson-subsampled Gaussian (exactly the pair (M, N₀), both orders), with
    pessimistic_estimate=False (losses rounded down, tails dropped)."""
    lower = pldm.from_gaussian_mechanism(
        z,
        sensitivity=1,
        pessimistic_estimate=False,
        value_discretization_interval=h,
        sampling_prob=p,
        use_connect_dots=False,
    )
    return float(lower.self_compose(T).get_epsilon_for_delta(delta))


@pytest.mark.parametrize("p,z", PAIRS)
def test_one_mixture_is_the_exact_realisable_epsilon(p: float, z: float) -> None:
    # T = 1: the dominating pair's δ at ε ≥ 0 is the realisable pair's, so the PLD's ε is the
    # exact one, rounded up by the discretisation only.
    exact = exact_epsilon_t1(p, z, DELTA)
    eps = pld.epsilon_of(p, z, 1, DELTA)
    assert exact <= eps <= exact * (1 + 2e-3) + 1e-4


@pytest.mark.parametrize("p,z", PAIRS[:4])
def test_two_mixtures_are_above_the_exact_realisable_bound(p: float, z: float) -> None:
    eps = pld.epsilon_of(p, z, 2, DELTA)
    # The realisable pair meets (ε_PLD, δ): the PLD is an upper bound on it …
    assert exact_lower_bound_delta(p, z, 2, eps) <= DELTA * (1 + 1e-9)
    # … and not a loose one: the realisable pair already needs 97 % of it.
    assert exact_lower_bound_delta(p, z, 2, 0.97 * eps) > DELTA


def test_mnist_small_t_is_above_the_optimistic_lower_bound() -> None:
    p, z = 64 / 10_000, joint_z(0.0872, 0.0872, 64)
    for T in (10, 100):
        eps = pld.epsilon_of(p, z, T, DELTA)
        lower = optimistic_lower_bound_epsilon(p, z, T, DELTA, 1e-5)
        assert lower <= eps <= 1.15 * lower


@pytest.mark.slow  # ~10 s: the optimistic PLD at T = 10⁴ needs a fine grid
def test_mnist_is_close_to_the_realisable_lower_bound() -> None:
    # MNIST: n = T = 10⁴, ℓ = 64 at the PLD's calibrated σ for ε = 1 and for ε = 10. In σ the
    # realisable pair needs 0.0783 and 0.0208 (calibrated on its connect-the-dots PLD): the PLD's
    # σ is 11 % and 9 % above; in ε, which is steeper, the margins below are 20 % and 35 %.
    for sigma, h, margin in ((0.08716, 1e-6, 1.2), (0.02275, 1e-5, 1.35)):
        p, z = 64 / 10_000, joint_z(sigma, sigma, 64)
        eps = pld.epsilon_of(p, z, 10_000, DELTA)
        lower = optimistic_lower_bound_epsilon(p, z, 10_000, DELTA, h)
        assert lower <= eps <= margin * lower


# --- the dominating pair's curve, by direct integration -------------------------------------


def integrated_hockey_stick(p: float, z: float, eps: float) -> float:
    """H_{e^ε}(P*‖Q*) by quadrature of the densities: for ε ≥ 0 of (M, N₀), below of (N₀, M)
    (the symmetric pair's δ at ε < 0 is 1 − e^ε + e^ε δ₊(−ε) = H_{e^ε}(N₀‖M))."""
    d = 1 / z

    def m(x: np.ndarray | float) -> np.ndarray | float:
        return (1 - p) * norm.pdf(x) + p * norm.pdf(x, d)

    upper, lower = (m, norm.pdf) if eps >= 0 else (norm.pdf, m)

    def gap(x: np.ndarray | float) -> np.ndarray | float:
        return np.log(upper(x)) - eps - np.log(lower(x))

    # The densities cross at most once; find where, then integrate the positive side.
    grid = np.linspace(-30, 30 + d, 6001)
    signs = np.sign(gap(grid))
    changes = np.flatnonzero(np.diff(signs) != 0)
    if changes.size == 0:
        return 0.0 if signs[0] < 0 else 1 - math.exp(eps)
    i = int(changes[0])
    cross = brentq(lambda x: float(gap(x)), grid[i], grid[i + 1], xtol=1e-14)
    a, b = (cross, 40 + d) if eps >= 0 else (-40, cross)
    value, _ = integrate.quad(
        lambda x: upper(x) - math.exp(eps) * lower(x), a, b, epsabs=1e-17, epsrel=1e-12, limit=400
    )
    return max(value, 0.0)


@pytest.mark.parametrize("p,z", PAIRS[:4])
def test_hockey_stick_closed_form_against_integration(p: float, z: float) -> None:
    for eps in (-2.0, -0.3, -0.01, -1e-4, 0.0, 1e-4, 0.003, 0.05, 0.3, 1.0, 3.0):
        direct = integrated_hockey_stick(p, z, eps)
        closed = float(pld.hockey_stick(p, z, eps))
        assert closed == pytest.approx(direct, rel=1e-7, abs=1e-15), eps


@pytest.mark.parametrize("p,z", PAIRS)
def test_one_mixture_pmf_dominates_the_curve_and_hugs_it(p: float, z: float) -> None:
    tail = pld.tail_level(DELTA, 1)
    h = pld.default_interval(p, z, tail)
    step = pld.mixture_pmf(p, z, h, tail)
    K = -step.lower
    losses = np.arange(-K, K + 1) * h
    assert np.all(step.probs >= 0)
    assert math.fsum(step.probs) + step.infinity == pytest.approx(1.0, abs=1e-12)
    assert math.fsum(step.probs * np.exp(-losses)) <= 1 + 1e-12
    distribution = step.pld()

    def discrete(eps: np.ndarray) -> np.ndarray:
        return np.array([distribution.get_delta_for_epsilon(float(e)) for e in eps])

    # On the grid connect-the-dots is exact (up to the +∞ part at K·h) …
    on_grid = np.unique(np.linspace(-K, K, 401).round()) * h
    exact = pld.hockey_stick(p, z, on_grid)
    assert discrete(on_grid) == pytest.approx(exact, rel=1e-8, abs=1e-13)
    # … and between grid points it is the chord in e^ε: above the curve, close to it.
    between = np.concatenate([(np.arange(-20, 20) + 1 / 3) * h, (np.arange(-K, K, 97) + 0.5) * h])
    exact = pld.hockey_stick(p, z, between)
    assert np.all(discrete(between) >= exact - 1e-14)
    assert np.all(discrete(between) <= exact * 1.02 + 2 * step.infinity + 1e-14)
    # Beyond the grid only the +∞ mass is left, which bounds the rest of the curve.
    assert discrete(np.array([K * h * 1.5]))[0] == step.infinity
    assert step.infinity >= float(pld.hockey_stick(p, z, K * h * 1.5))


@pytest.mark.parametrize("p,z", PAIRS[:4])
def test_one_mixture_pmf_is_dp_accountings_connect_the_dots(p: float, z: float) -> None:
    h = pld.default_interval(p, z, pld.MIN_TAIL)
    step = pld.mixture_pmf(p, z, h)
    k = np.arange(step.lower, step.lower + step.probs.size)
    reference = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        h, int(k[0]), int(k[-1]), pld.hockey_stick(p, z, k * h)
    )
    eps = np.linspace(k[0] * h, k[-1] * h, 301)
    ours = step.pld()
    theirs = PrivacyLossDistribution(reference)
    for e in eps:
        assert ours.get_delta_for_epsilon(float(e)) == pytest.approx(
            theirs.get_delta_for_epsilon(float(e)), rel=1e-8, abs=1e-11
        )


@pytest.mark.parametrize("p,z", PAIRS[:4])
def test_one_mixture_at_nonnegative_epsilon_is_dp_accountings_add_remove_curve(
    p: float, z: float
) -> None:
    # At ε ≥ 0 the dominating pair's δ is that of the one-sided pair (M, N₀), which
    # dp_accounting builds (pessimistically) as its add/remove Poisson-subsampled Gaussian.
    h = 1e-4
    reference = pldm.from_gaussian_mechanism(
        z, sensitivity=1, value_discretization_interval=h, sampling_prob=p
    )
    ours = pld.mixture_pld(p, z, h)
    for eps in (0.0, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0):
        ref = reference.get_delta_for_epsilon(eps)
        assert ours.get_delta_for_epsilon(eps) == pytest.approx(ref, rel=1e-3, abs=1e-11)


def test_the_antipodal_pair_of_radius_half_delta_is_not_dominating() -> None:
    # ((1 − p)N₀ + pN(−Δ/2), (1 − p)N₀ + pN(Δ/2)) is a feasible conditional pair, but its δ
    # is below δ₊, which a realisable pair attains: it is not a valid dominating pair.
    # Radius Δ (dp_accounting's REPLACE_ONE Poisson pair, sensitivity 1, noise z) dominates.
    p, z = 64 / 10_000, 2.79
    d = 1 / z

    def antipodal(a: float, eps: float) -> float:
        def upper(x: float) -> float:
            return (1 - p) * norm.pdf(x) + p * norm.pdf(x, a)

        def lower(x: float) -> float:
            return (1 - p) * norm.pdf(x) + p * norm.pdf(x, -a)

        value, _ = integrate.quad(
            lambda x: max(upper(x) - math.exp(eps) * lower(x), 0.0),
            0.0,
            40.0,
            epsabs=1e-17,
            limit=400,
        )
        return value

    assert antipodal(d / 2, 0.0) == pytest.approx(float(pld.hockey_stick(p, z, 0.0)), rel=1e-9)
    for eps, ratio in ((0.001, 0.95), (0.003, 0.6), (0.01, 0.01)):
        exact = float(pld.hockey_stick(p, z, eps))
        assert antipodal(d / 2, eps) < ratio * exact
        assert antipodal(d, eps) >= exact


# --- the real mechanism on small datasets --------------------------------------------------


def mixture_means(records: np.ndarray, ell: int) -> np.ndarray:
    """The mean of every ℓ-subset: one mixture's output is uniform over them, plus N(0, 1)."""
    return np.array(
        [records[list(s)].mean() for s in itertools.combinations(range(records.size), ell)]
    )


def small_datasets(z: float, ell: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Neighbouring datasets (record 0 replaced) in whitened units: records in [0, ℓΔ], so one
    replacement moves a mixture mean by at most Δ = 1/z. First the realisable worst case
    (every other record equals the replacement), then the others split between the two
    values of record 0 (their mixtures lean both ways), all at the midpoint, and random."""
    span = ell / z
    rest = n - 1
    split = np.concatenate([np.zeros(rest // 2), np.full(rest - rest // 2, span)])
    pairs = [
        (np.zeros(n), np.concatenate([[span], np.zeros(rest)])),
        (np.concatenate([[0.0], split]), np.concatenate([[span], split])),
        (
            np.concatenate([[0.0], np.full(rest, span / 2)]),
            np.concatenate([[span], np.full(rest, span / 2)]),
        ),
    ]
    rng = np.random.default_rng(seed)
    for _ in range(3):
        d = rng.uniform(0, span, n)
        d_prime = d.copy()
        d_prime[0] = rng.choice([0.0, span, rng.uniform(0, span)])
        pairs.append((d, d_prime))
    return pairs


def output_grid(means: np.ndarray, means_prime: np.ndarray, points: int) -> np.ndarray:
    low = min(means.min(), means_prime.min()) - 11
    high = max(means.max(), means_prime.max()) + 11
    return np.linspace(low, high, points)


@pytest.mark.parametrize("z,ell,n", [(0.8, 3, 6), (2.0, 2, 7)])
def test_one_mixture_of_the_real_mechanism_is_below_the_dominating_curve(
    z: float, ell: int, n: int
) -> None:
    # The output law of one mixture, exactly: uniform over the C(n, ℓ) subset means, plus
    # N(0, 1); its hockey-stick divergence by the midpoint rule on a fine grid (~1e-9).
    p = ell / n
    for case, (d, d_prime) in enumerate(small_datasets(z, ell, n, seed=ell)):
        means, means_prime = mixture_means(d, ell), mixture_means(d_prime, ell)
        x = output_grid(means, means_prime, 200_001)
        dx = x[1] - x[0]
        density = norm.pdf(x[:, None] - means[None, :]).mean(axis=1)
        density_prime = norm.pdf(x[:, None] - means_prime[None, :]).mean(axis=1)
        for order, (upper, lower) in enumerate(
            ((density, density_prime), (density_prime, density))
        ):
            for eps in (-0.5, -0.05, 0.0, 0.05, 0.3, 1.0):
                value = np.sum(np.maximum(upper - math.exp(eps) * lower, 0.0)) * dx
                bound = float(pld.hockey_stick(p, z, eps))
                assert value <= bound + 1e-8, (d, d_prime, eps)
                if case == 0 and order == 1 and eps >= 0:  # (M, N₀): the bound is attained
                    assert value >= bound * (1 - 1e-6) - 1e-12


def binned_hockey_stick_two_mixtures(
    means: np.ndarray, means_prime: np.ndarray, eps: float
) -> float:
    """H_{e^ε} of two independent mixtures of the real mechanism, output binned on a fine
    grid (a post-processing, so at most the true value; the bins are fine enough that it is
    within ~1e-7 of it). With the per-mixture losses l_i sorted, the inner hockey-stick of
    the second mixture at e^{ε − l_i} is a suffix sum."""
    x = np.linspace(
        min(means.min(), means_prime.min()) - 11, max(means.max(), means_prime.max()) + 11, 40_001
    )
    dx = x[1] - x[0]
    upper = norm.pdf(x[:, None] - means[None, :]).mean(axis=1) * dx
    lower = norm.pdf(x[:, None] - means_prime[None, :]).mean(axis=1) * dx
    loss = np.log(upper) - np.log(lower)
    order = np.argsort(loss)
    sorted_loss = loss[order]
    upper_tail = np.cumsum(upper[order][::-1])[::-1]  # mass with loss ≥ sorted_loss[k]
    lower_tail = np.cumsum(lower[order][::-1])[::-1]
    index = np.searchsorted(sorted_loss, eps - loss, side="right")
    inside = index < loss.size
    inner = np.zeros(loss.size)
    k = index[inside]
    inner[inside] = upper_tail[k] - np.exp(eps - loss[inside]) * lower_tail[k]
    return float(np.sum(upper * np.maximum(inner, 0.0)))


def test_two_mixtures_of_the_real_mechanism_are_below_the_composed_pld() -> None:
    z, ell, n = 0.8, 3, 6
    p = ell / n
    composed = pld.compose(pld.mixture_pmf(p, z, 1e-3), 2)
    for d, d_prime in small_datasets(z, ell, n, seed=1):
        means, means_prime = mixture_means(d, ell), mixture_means(d_prime, ell)
        for a, b in ((means, means_prime), (means_prime, means)):
            for eps in (0.0, 0.3, 1.0, 2.0):
                value = binned_hockey_stick_two_mixtures(a, b, eps)
                assert value <= composed.get_delta_for_epsilon(eps) + 1e-9


# --- composition ----------------------------------------------------------------------------


@pytest.mark.parametrize("T", [2, 7, 100, 10_000])
def test_composition_matches_dp_accountings_self_compose(T: int) -> None:
    p, z = 64 / 10_000, 2.79
    h = pld.default_interval(p, z, pld.tail_level(DELTA, T))
    step = pld.mixture_pmf(p, z, h, pld.tail_level(DELTA, T))
    ours = pld.compose(step, T)
    reference = step.pld().self_compose(T)
    eps = ours.get_epsilon_for_delta(DELTA)
    for e in np.linspace(0, 3 * eps, 9):
        assert ours.get_delta_for_epsilon(float(e)) == pytest.approx(
            reference.get_delta_for_epsilon(float(e)), rel=1e-9, abs=1e-12
        )


@pytest.mark.skipif(bool(np.finfo(np.longdouble).eps > 1e-18), reason="no extended long double")
def test_composition_keeps_its_precision_at_a_million_mixtures() -> None:
    # dp_accounting's self_compose in float64 loses ~T·2⁻⁵² (1e-10 here); in long double
    # (its FFT follows the input's precision) it is the reference.
    p, z, T, delta = 64 / 10**6, 0.6886, 10**6, 1e-6
    tail = pld.tail_level(delta, T)
    h = pld.default_interval(p, z, tail)
    step = pld.mixture_pmf(p, z, h, tail)
    ours = pld.compose(step, T)
    extended = pld.DiscretePLD(step.probs.astype(np.longdouble), step.lower, step.infinity, h)
    reference = extended.pld().self_compose(T)
    for e in (0.0, 0.5, 1.0, 1.5, 2.0):
        assert ours.get_delta_for_epsilon(e) == pytest.approx(
            float(reference.get_delta_for_epsilon(e)), rel=1e-5, abs=1e-11
        )


def test_discretisation_error_is_small() -> None:
    # Every interval gives a valid bound; the default one is within 0.1 % of a 6× finer one.
    for n, ell, T, sigma, delta in [
        (10_000, 64, 10_000, 0.0872, 1e-5),
        (10_000, 8, 10_000, 0.1044, 1e-5),
        (10**6, 64, 10**6, 0.02152, 1e-6),
    ]:
        event = DPMixPLDEvent(n, ell, T, sigma, sigma)
        h = event.value_discretization_interval(delta)
        fine = pld.epsilon_of(event.sampling_prob, event.noise_multiplier, T, delta, h / 6)
        assert event.epsilon(delta) == pytest.approx(fine, rel=1e-3)


# --- against the RDP accountant -------------------------------------------------------------


GRID = [
    (n, ell, T, sigma, delta)
    for n, ell, T, sigma, delta in itertools.product(
        [100, 10_000], [1, 8, 64, 100], [1, 50, 10_000], [0.02, 0.1, 1.0], [1e-5, 1e-9]
    )
    if ell <= n
]


def test_pld_is_never_worse_than_rdp() -> None:
    checked = 0
    for n, ell, T, sigma, delta in GRID:
        for sigma_y in (sigma, 3 * sigma):
            rdp = DPMixEvent(n, ell, T, sigma, sigma_y).epsilon(delta)
            if rdp > 1e3:  # a single mixture's loss beyond MAX_LOSS: the PLD says inf
                continue
            event = DPMixPLDEvent(n, ell, T, sigma, sigma_y)
            ours = pld.epsilon_of(event.sampling_prob, event.noise_multiplier, T, delta)
            assert ours <= rdp * (1 + 1e-9), (n, ell, T, sigma, sigma_y, delta)
            checked += 1
    assert checked > 100


def test_event_epsilon_is_never_worse_than_rdp_even_where_the_pld_gives_up() -> None:
    event = DPMixPLDEvent(10_000, 8, 10, 0.003, 0.003)  # z ≈ 0.012: one mixture ε ≈ 3500
    p, z = event.sampling_prob, event.noise_multiplier
    assert pld.epsilon_of(p, z, 10, DELTA) == math.inf
    rdp = DPMixEvent(10_000, 8, 10, 0.003, 0.003).epsilon(DELTA)
    assert event.epsilon(DELTA) == rdp < math.inf


# --- calibration and the event --------------------------------------------------------------


@pytest.mark.parametrize(
    "n,ell,T,target,delta",
    [
        (10_000, 64, 10_000, 1.0, 1e-5),
        (10_000, 256, 10_000, 1.0, 1e-5),
        (10_000, 8, 10_000, 10.0, 1e-5),
        (1_000, 10, 100, 0.5, 1e-6),
    ],
)
def test_calibration_never_overshoots(
    n: int, ell: int, T: int, target: float, delta: float
) -> None:
    event = pld.calibrate(n=n, mixture_degree=ell, n_samples=T, epsilon=target, delta=delta)
    assert event.epsilon(delta) <= target
    # A fresh event at the same σ (nothing cached) agrees; a slightly smaller σ overshoots.
    fresh = DPMixPLDEvent(n, ell, T, event.sigma_x * (1 + 1e-12), event.sigma_y * (1 + 1e-12))
    assert fresh.epsilon(delta) <= target
    smaller = DPMixPLDEvent(n, ell, T, event.sigma_x * (1 - 1e-4), event.sigma_y * (1 - 1e-4))
    assert smaller.epsilon(delta) > target
    rdp = rdp_calibrate(n=n, mixture_degree=ell, n_samples=T, epsilon=target, delta=delta)
    assert event.sigma_x <= rdp.sigma_x


def test_mnist_needs_about_half_the_noise_of_rdp() -> None:
    # The review's numbers: ε = 1, δ = 1e-5, n = T = 10⁴: σ 0.1643 → ~0.088 (ℓ = 64) and
    # 0.1628 → ~0.079 (ℓ = 256).
    for ell, rdp_sigma, review in ((64, 0.1643, 0.088), (256, 0.1628, 0.079)):
        event = pld.calibrate(
            n=10_000, mixture_degree=ell, n_samples=10_000, epsilon=1.0, delta=DELTA
        )
        rdp = rdp_calibrate(
            n=10_000, mixture_degree=ell, n_samples=10_000, epsilon=1.0, delta=DELTA
        )
        assert rdp.sigma_x == pytest.approx(rdp_sigma, rel=1e-3)
        assert event.sigma_x == pytest.approx(review, rel=0.03)


def test_epsilon_is_monotone_in_sigma_near_a_calibrated_value() -> None:
    sigmas = 0.0872 * (1 + np.linspace(-2e-4, 2e-4, 9))
    eps = [DPMixPLDEvent(10_000, 64, 10_000, s, s).epsilon(DELTA) for s in sigmas]
    assert all(a > b for a, b in itertools.pairwise(eps))


def test_event_contract() -> None:
    event = DPMixPLDEvent(10_000, 64, 10_000, 0.09, 0.12)
    reference = DPMixEvent(10_000, 64, 10_000, 0.09, 0.12)
    assert event.noise_multiplier == pytest.approx(reference.noise_multiplier, rel=1e-15)
    assert event.noise_multiplier == pytest.approx(joint_z(0.09, 0.12, 64), rel=1e-12)
    cost = event.cost(DELTA)
    assert isinstance(cost, Cost)
    assert cost.epsilon == event.epsilon(DELTA) and cost.delta == DELTA
    # The RDP curve rides along for the ledger's filter (its Rényi way).
    assert cost.rdp == reference.rdp() and cost.mu is None
    assert event.noise() == _mixing_noise(0.09, 0.12, 64)
    described = event.describe()
    assert described["accountant"] == "pld" and described["mechanism"] == "dpmix"
    assert described["sigma_y"] == 0.12 and described["sampling_prob"] == 64 / 10_000
    keys = {"n": 100, "mixture_degree": 4, "n_samples": 10, "noise_ratio": 2.0}
    built = pld.build(0.5, {**keys, "assignment": "mixture"})
    assert built == DPMixPLDEvent(100, 4, 10, 0.5, 1.0)
    assert isinstance(pld.build(0.5, {**keys, "assignment": "record"}), DPMixRecordEvent)
    assert pld.build(0.5, {**keys, "sigma_y": 0.3, "assignment": "mixture"}) == DPMixPLDEvent(
        100, 4, 10, 0.5, 0.3
    )
    for bad in [(0, 1, 1, 1.0, 1.0), (10, 11, 1, 1.0, 1.0), (10, 2, 0, 1.0, 1.0)]:
        with pytest.raises(ValueError):
            DPMixPLDEvent(*bad)
    for sigma in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            DPMixPLDEvent(10, 2, 1, sigma, 1.0)
    with pytest.raises(ValueError):
        DPMixPLDEvent(10, 2.5, 1, 1.0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        event.epsilon(0.0)


def test_guess_is_near_the_calibrated_sigma() -> None:
    keys = {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "noise_ratio": 1.0}
    guess = pld.guess_sigma(keys, 1.0, DELTA)
    assert 0.5 * 0.0872 < guess < 2 * 0.0872


@pytest.mark.slow  # a wall-time assertion (~1 s here): kept out of make test-fast
def test_million_mixture_calibration_is_fast_and_sound() -> None:
    start = time.perf_counter()
    event = pld.calibrate(n=10**6, mixture_degree=64, n_samples=10**6, epsilon=1.0, delta=1e-6)
    elapsed = time.perf_counter() - start
    assert event.epsilon(1e-6) <= 1.0
    rdp = rdp_calibrate(n=10**6, mixture_degree=64, n_samples=10**6, epsilon=1.0, delta=1e-6)
    assert event.sigma_x < 0.8 * rdp.sigma_x
    assert elapsed < 10
