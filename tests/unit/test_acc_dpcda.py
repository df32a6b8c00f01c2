"""DP-CDA accountants: WBK within one class (`paper`) and the replace-one analysis that also
covers a record changing class (`tight`)."""

from __future__ import annotations

import itertools
import math
import warnings

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from scipy import integrate
from scipy.special import logsumexp
from scipy.stats import norm

from dpcore.accounting.accountant import Accountant
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpcda.accounting import DPCDAEvent, DPCDAPaperEvent
from dpcore.mechanisms.secure_random import SecureRandom
from tests.unit.test_noise_sensitivity import Recorder

PAPER = registry.accountant("dpcda", "paper")
TIGHT = registry.accountant("dpcda", "tight")
MNIST = {
    "n": 60000,
    "mixture_degree": 16,
    "n_samples": 60000,
    "clip_norm": 1.0,
    "n_classes": 10,
    "min_class_size": 5000,
    "standardization": "declared",  # z-scored: records up to 2C apart
    "class_sizes": "declared",  # the restricted relation these tests analyse
}
SMALL = {
    "n": 3000,
    "mixture_degree": 8,
    "n_samples": 500,
    "clip_norm": 2.0,
    "n_classes": 3,
    "min_class_size": 400,
    "standardization": "declared",
    "class_sizes": "declared",
}


def _wor_accountant(m: int, ell: int, z: float, count: int) -> np.ndarray:
    acc = dpa.rdp.RdpAccountant(list(ORDERS), dpa.NeighboringRelation.REPLACE_ONE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        acc.compose(dpa.SampledWithoutReplacementDpEvent(m, ell, dpa.GaussianDpEvent(z)), count)
    return np.asarray(acc.rdp)


def _poisson_accountant(q: float, z: float, count: int) -> np.ndarray:
    acc = dpa.rdp.RdpAccountant(list(ORDERS), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), count)
    return np.asarray(acc.rdp)


@pytest.mark.parametrize("keys", [MNIST, SMALL])
@pytest.mark.parametrize("sigma", [0.05, 0.3, 2.0])
def test_paper_curve_is_the_wor_composition(keys: dict, sigma: float) -> None:  # type: ignore[type-arg]
    event = PAPER.at_sigma(sigma, keys)
    assert isinstance(event, DPCDAPaperEvent)
    ell, C = keys["mixture_degree"], keys["clip_norm"]
    t_c = math.ceil(keys["n_samples"] / keys["n_classes"])
    assert event.mixtures_per_class == t_c
    z = sigma * ell / (2 * C)
    assert event.noise_multiplier == pytest.approx(z, rel=1e-15)
    expected = _wor_accountant(keys["min_class_size"], ell, z, t_c)
    np.testing.assert_allclose(event.rdp(), expected, rtol=1e-9)
    assert event.epsilon(1e-5) == pytest.approx(epsilon_from_rdp(expected, delta=1e-5), rel=1e-9)


@pytest.mark.parametrize("keys", [MNIST, SMALL])
@pytest.mark.parametrize("sigma", [0.05, 0.3, 2.0])
def test_tight_is_the_max_of_the_two_cases(keys: dict, sigma: float) -> None:  # type: ignore[type-arg]
    tight = TIGHT.at_sigma(sigma, keys)
    paper = PAPER.at_sigma(sigma, keys)
    assert isinstance(tight, DPCDAEvent)
    curve, stay = np.asarray(tight.rdp()), np.asarray(paper.rdp())
    assert np.all(curve >= stay)  # tight ≥ paper pointwise
    t_c = math.ceil(keys["n_samples"] / keys["n_classes"])
    q = keys["mixture_degree"] / keys["min_class_size"]
    move = _poisson_accountant(q, tight.noise_multiplier, 2 * t_c)
    np.testing.assert_allclose(tight.move_curve(), move, rtol=1e-9)
    np.testing.assert_allclose(curve, np.maximum(stay, move), rtol=1e-9)
    assert epsilon_from_rdp(tight.rdp(), delta=1e-5) >= paper.epsilon(1e-5)
    # The event's ε is the smaller of its PLD's and its RDP curve's.
    rdp_eps = epsilon_from_rdp(tight.rdp(), delta=1e-5)
    assert tight.epsilon(1e-5) == min(tight.pld_epsilon(1e-5), rdp_eps)
    cost = tight.cost(1e-5)
    assert cost.rdp == tight.rdp() and cost.epsilon == tight.epsilon(1e-5)


def test_single_class_has_no_move_case() -> None:
    keys = {**SMALL, "n_classes": 1, "n_samples": 200}
    tight, paper = TIGHT.at_sigma(0.5, keys), PAPER.at_sigma(0.5, keys)
    assert tight.rdp() == paper.rdp()


# ------------------------------------------------------------------------------------------
# brute force: exact output densities for tiny datasets
# ------------------------------------------------------------------------------------------


def _mixture_logpdf(points: list[float], ell: int, sigma: float):  # type: ignore[no-untyped-def]
    """log-density of the mean of a uniform ℓ-subset of ``points`` plus N(0, σ²)."""
    means = np.array([np.mean(s) for s in itertools.combinations(points, ell)])

    def logpdf(y: float) -> float:
        return float(logsumexp(norm.logpdf(y, means, sigma)) - math.log(len(means)))

    return logpdf


def _renyi(logp, logq, alpha: float, lo: float, hi: float) -> float:  # type: ignore[no-untyped-def]
    """D_α(P ‖ Q) = log ∫ p^α q^(1−α) / (α − 1), by scipy quadrature."""

    def integrand(y: float) -> float:
        return math.exp(alpha * logp(y) + (1 - alpha) * logq(y))

    value, _ = integrate.quad(integrand, lo, hi, limit=400, epsabs=0, epsrel=1e-11)
    return math.log(value) / (alpha - 1)


def _order_index(alpha: float) -> int:
    return ORDERS.index(float(alpha))


ADD_ONE_CASES = [
    # (D_b, x): worst-case-like and random configurations, C = 1
    ([-1.0, -1.0, -1.0, -1.0], 1.0),
    ([-1.0, 0.5, -0.3, 1.0], 1.0),
    ([0.2, -0.9, 0.7, -0.1], -1.0),
    ([-1.0, -1.0, 1.0, 1.0], 0.0),
]


@pytest.mark.parametrize("case", ADD_ONE_CASES)
@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_add_one_coupling_brute_force(case: tuple, sigma: float) -> None:  # type: ignore[type-arg]
    """n_b = 4, ℓ = 2, 1-D, C = 1: the exact Rényi divergences between the outputs on D_b and
    on D_b ∪ {x}, both directions, are within the Poisson-subsampled Gaussian RDP at
    q′ = ℓ/(n_b + 1) (hence at q = ℓ/m with m = n_b), z = σℓ/(2C)."""
    d_b, x = case
    ell, C = 2, 1.0
    p = _mixture_logpdf(d_b, ell, sigma)
    q = _mixture_logpdf([*d_b, x], ell, sigma)
    z = sigma * ell / (2 * C)
    bound_exact_q = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(ell / 5, z, ORDERS)
    bound_m = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(ell / 4, z, ORDERS)
    lo, hi = -1 - 40 * sigma, 1 + 40 * sigma
    for alpha in (2.0, 3.0):
        i = _order_index(alpha)
        for a, b in ((p, q), (q, p)):
            div = _renyi(a, b, alpha, lo, hi)
            assert div <= bound_exact_q[i] * (1 + 1e-6)
            assert bound_exact_q[i] <= bound_m[i]


@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_move_case_brute_force(sigma: float) -> None:
    """A record moving from class a to class b: the two classes' outputs are independent, so
    the divergence is the sum; it is within case (b) of the tight curve (T_c = 1, m = 4)."""
    ell = 2
    d_a, d_b = [1.0, -1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]
    x_new = 1.0
    pa, pa2 = _mixture_logpdf(d_a, ell, sigma), _mixture_logpdf(d_a[1:], ell, sigma)
    pb, pb2 = _mixture_logpdf(d_b, ell, sigma), _mixture_logpdf([*d_b, x_new], ell, sigma)
    event = DPCDAEvent(9, ell, 2, 1.0, 2, 4, sigma)
    lo, hi = -1 - 40 * sigma, 1 + 40 * sigma
    for alpha in (2.0, 3.0):
        i = _order_index(alpha)
        total = _renyi(pa, pa2, alpha, lo, hi) + _renyi(pb, pb2, alpha, lo, hi)
        back = _renyi(pa2, pa, alpha, lo, hi) + _renyi(pb2, pb, alpha, lo, hi)
        assert max(total, back) <= event.move_curve()[i] * (1 + 1e-6)
        assert max(total, back) <= event.rdp()[i] * (1 + 1e-6)


@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_stay_case_brute_force(sigma: float) -> None:
    """Replace-one inside a class of 4 (ℓ = 2): within WBK at q = ℓ/m = 1/2 (case (a))."""
    ell = 2
    d, d2 = [1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]
    p, q = _mixture_logpdf(d, ell, sigma), _mixture_logpdf(d2, ell, sigma)
    event = DPCDAPaperEvent(8, ell, 2, 1.0, 2, 4, sigma)
    lo, hi = -1 - 40 * sigma, 1 + 40 * sigma
    for alpha in (2.0, 3.0):
        i = _order_index(alpha)
        for a, b in ((p, q), (q, p)):
            assert _renyi(a, b, alpha, lo, hi) <= event.stay_curve()[i] * (1 + 1e-6)


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("z", [0.6, 1.0, 3.0])
def test_mixture_to_gaussian_direction_dominates(q: float, z: float) -> None:
    """MTZ Thm 5, numerically: D_α(N(0,z²) ‖ mix) ≤ D_α(mix ‖ N(0,z²)) = dp_accounting's RDP,
    mix = (1−q)N(0, z²) + qN(1, z²), at integer and fractional orders."""

    def mix(y: float) -> float:
        return float(
            np.logaddexp(math.log1p(-q) + norm.logpdf(y, 0, z), math.log(q) + norm.logpdf(y, 1, z))
        )

    def gauss(y: float) -> float:
        return float(norm.logpdf(y, 0, z))

    lo, hi = -40 * z, 1 + 40 * z
    for alpha in (1.5, 2.0, 3.0, 6.0):
        library = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, z, [alpha])[0]
        forward = _renyi(mix, gauss, alpha, lo, hi)
        if float(alpha).is_integer():  # exact binomial expansion
            assert library == pytest.approx(forward, rel=1e-6)
        else:  # dp_accounting's series: an upper bound (inf where it does not converge)
            assert library >= forward * (1 - 1e-7)
        assert _renyi(gauss, mix, alpha, lo, hi) <= forward * (1 + 1e-6)


# ------------------------------------------------------------------------------------------
# numbers, calibration, keys
# ------------------------------------------------------------------------------------------


def test_reference_numbers() -> None:
    # MNIST-sized: n = 60000, K = 10, m = 5000, ℓ = 16, T = 60000, C = 1, δ = 1e-5.
    # Regression values (the independent checks are the tests below and above).
    def rdp_eps(sigma: float) -> float:
        return epsilon_from_rdp(TIGHT.at_sigma(sigma, MNIST).rdp(), delta=1e-5)  # type: ignore[attr-defined]

    assert rdp_eps(0.3) == pytest.approx(0.87274, abs=1e-4)
    assert rdp_eps(0.05) == pytest.approx(73.4896, abs=1e-3)
    assert PAPER.at_sigma(0.05, MNIST).epsilon(1e-5) == pytest.approx(73.4448, abs=1e-3)
    # The PLD: (ε_a, ε_b) = (0.4314, 0.5401) at σ = 0.3, case (b) the larger.
    assert TIGHT.at_sigma(0.3, MNIST).epsilon(1e-5) == pytest.approx(0.54012, abs=1e-4)
    assert TIGHT.calibrate(1.0, 1e-5, MNIST).sigma == pytest.approx(0.184128, rel=1e-4)  # was 0.268
    unit = {**MNIST, "standardization": "unit_range"}
    assert TIGHT.calibrate(1.0, 1e-5, unit).sigma == pytest.approx(0.130198, rel=1e-4)


@pytest.mark.parametrize("acc", [PAPER, TIGHT])
@pytest.mark.parametrize("target", [0.2, 1.0, 8.0])
def test_calibration_never_overshoots(acc: Accountant, target: float) -> None:
    event = acc.calibrate(target, 1e-5, SMALL)
    assert event.epsilon(1e-5) <= target
    assert acc.at_sigma(event.sigma * (1 - 1e-5), SMALL).epsilon(1e-5) > target


def test_monotone_in_sigma_and_T() -> None:
    eps = [TIGHT.at_sigma(s, SMALL).epsilon(1e-5) for s in (0.1, 0.3, 1.0, 3.0)]
    assert all(a > b for a, b in itertools.pairwise(eps))
    by_T = [TIGHT.at_sigma(0.5, {**SMALL, "n_samples": t}).epsilon(1e-5) for t in (3, 30, 300)]
    assert all(a < b for a, b in itertools.pairwise(by_T))


def test_description_and_noise() -> None:
    event = TIGHT.at_sigma(0.5, SMALL)
    d = event.describe()
    assert d["mechanism"] == "dpcda" and d["accountant"] == "tight"
    assert d["mixtures_per_class"] == math.ceil(500 / 3)
    assert PAPER.at_sigma(0.5, SMALL).describe()["accountant"] == "paper"
    assert (event.noise().sigma_x, event.noise().sigma_y) == (0.5, None)


@pytest.mark.parametrize("acc", [PAPER, TIGHT])
@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({k: v for k, v in SMALL.items() if k != "min_class_size"}, "needs key min_class_size"),
        ({**SMALL, "extra": 1}, "unknown key"),
        ({**SMALL, "mixture_degree": 2.5}, "integer"),
        ({**SMALL, "min_class_size": 4}, "min_class_size must be >= mixture_degree"),
        ({**SMALL, "min_class_size": 1001}, "exceeds n"),
        ({**SMALL, "clip_norm": 0}, "clip_norm must be finite and > 0"),
        ({**SMALL, "n_classes": 0}, "n_classes must be >= 1"),
        ({**SMALL, "n_samples": 0}, "n_samples must be >= 1"),
    ],
)
def test_key_errors_are_clear(acc: Accountant, keys: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        acc.at_sigma(1.0, keys)


def test_paper_is_flagged_as_not_a_valid_bound() -> None:
    assert not PAPER.valid_bound and PAPER.caveat
    assert TIGHT.valid_bound


def test_dp_statistics_compose_as_gdp() -> None:
    """DP statistics (μ = √(2d)/stats_noise) add their RDP αμ²/2 to the mixtures' curve,
    order by order, in one event whose noise lists both scales."""
    from dpcore.accounting.orders import ORDERS
    from dpcore.mechanisms.dpcda.accounting import DPCDAEvent

    keys = {
        "n": 1000,
        "mixture_degree": 8,
        "n_samples": 300,
        "clip_norm": 1.0,
        "n_classes": 10,
        "min_class_size": 80,
        "class_sizes": "declared",
    }
    base = TIGHT.at_sigma(0.5, {**keys, "standardization": "declared"})
    assert base == DPCDAEvent(1000, 8, 300, 1.0, 10, 80, 0.5)
    keys["standardization"] = "dp"
    # d = 2, stats_noise = 2/0.7: μ = √(2·2)/(2/0.7) = 0.7.
    with_stats = TIGHT.at_sigma(0.5, {**keys, "stats_noise": 2 / 0.7, "d_x": 2})
    for a, b, order in zip(base.rdp(), with_stats.rdp(), ORDERS, strict=True):
        assert b == pytest.approx(a + order * 0.7**2 / 2, rel=1e-12)
    assert with_stats.epsilon(1e-5) > base.epsilon(1e-5)
    assert [s.name for s in with_stats.noise().scales] == ["statistics", "features"]
    assert with_stats.noise().scale("statistics").sensitivity == pytest.approx(2.0)
    with pytest.raises(ValueError, match="d_x"):
        TIGHT.at_sigma(0.5, {**keys, "stats_noise": 1.0})
    with pytest.raises(ValueError, match="stats_noise"):
        TIGHT.at_sigma(0.5, {**keys, "stats_noise": -1.0, "d_x": 2})


def test_dp_statistics_sensitivity_and_accuracy() -> None:
    """The sensitivity dp_statistics hands its sampler covers every replace-one neighbour of
    [0, 1] records and is reached (a zero row replaced by a ones row moves the sums and the
    sums of squares by √d each); the means and stds come back at negligible noise."""
    import torch

    from dpcore.mechanisms.dpcda.release import dp_statistics
    from dpcore.mechanisms.noise import FastNoise, SecureNoise

    recorder = Recorder()
    rng = np.random.default_rng(0)
    unit = rng.uniform(0, 1, size=(500, 7))
    unit[0] = 0.0
    dp_statistics(unit, 1.0, recorder)
    neighbours = [unit.copy() for _ in range(40)]
    neighbours[0][0] = 1.0  # the worst case
    for other in neighbours[1:]:
        other[rng.integers(500)] = rng.integers(0, 2, size=7)
    for other in neighbours:
        dp_statistics(other, 1.0, recorder)
    (base, _, declared), *rest = recorder.calls
    assert {s for _, _, s in rest} == {declared}
    moved = [torch.linalg.vector_norm(v - base).item() for v, _, _ in rest]
    assert max(moved) <= declared * (1 + 1e-12)
    assert moved[0] == pytest.approx(declared, rel=1e-12)
    for noise in (FastNoise(SecureRandom.from_seed(0)), SecureNoise()):
        mean, std = dp_statistics(unit, 1e-6, noise)
        assert np.allclose(mean, unit.mean(0), atol=1e-6)
        assert np.allclose(std, unit.std(0), atol=1e-5)


def test_unit_range_is_the_declared_analysis_at_sqrt2_less_noise() -> None:
    """unit_range (the default) records are ≤ √2·C apart: its event at σ is the z-scored
    one's at √2·σ (same noise multiplier σℓ/R), in both accountants."""
    unit = {**SMALL, "standardization": "unit_range"}
    for acc in (PAPER, TIGHT):
        a, b = acc.at_sigma(0.4, unit), acc.at_sigma(0.4 * math.sqrt(2), SMALL)
        assert a.noise_multiplier == pytest.approx(b.noise_multiplier, rel=1e-15)
        assert a.rdp() == pytest.approx(b.rdp(), rel=1e-12)
        assert a.sensitivity == pytest.approx(math.sqrt(2) * 2.0 / 8, rel=1e-15)
    default = {k: v for k, v in SMALL.items() if k != "standardization"}
    assert TIGHT.at_sigma(0.4, default) == TIGHT.at_sigma(0.4, unit)
    # 'dp' z-scores (records up to 2C apart, the declared analysis, not unit_range's) and adds
    # the statistics' Gaussian, μ = √(2·3)/9.
    dp = TIGHT.at_sigma(0.4, {**SMALL, "standardization": "dp", "stats_noise": 9.0, "d_x": 3})
    declared = TIGHT.at_sigma(0.4, SMALL)
    assert dp.noise().scale("features").sensitivity == pytest.approx(declared.sensitivity)
    for a, b, order in zip(declared.rdp(), dp.rdp(), ORDERS, strict=True):
        assert b == pytest.approx(a + order * (6 / 81) / 2, rel=1e-12)
    with pytest.raises(ValueError, match="stats_noise"):
        TIGHT.at_sigma(0.4, {**SMALL, "standardization": "dp"})
    with pytest.raises(ValueError, match="stats_noise"):
        TIGHT.at_sigma(0.4, {**unit, "stats_noise": 9.0, "d_x": 3})
