"""DPGM accountants: the paper's Theorem 4 (numerical E1/E2, Hölder weights) and the tight
replace-one PLD analysis."""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import dp_accounting as dpa
import mpmath as mp
import numpy as np
import pytest
import torch
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian
from scipy import integrate, special

from dpcore.accounting import dpsgd, gdp
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpgm.accounting import (
    HOLDER_WEIGHTS,
    DPGMEvent,
    DPGMPaperEvent,
    alpha_sgd,
    log_e1_e2,
)
from dpcore.mechanisms.kmeans import (
    COUNT_SENSITIVITY,
    FOURIER_SUM_SENSITIVITY,
    FourierFeatures,
    noisy_statistics,
    step_mu2,
)
from dpcore.mechanisms.secure_random import SecureRandom
from tests.unit.test_noise_sensitivity import Recorder

SQRT2 = math.sqrt(2.0)
# The charged ε over the realisable antipodal gradient pair's (prv upper estimate) at the paper's
# MNIST settings: measured 1.24–1.79 (the k-means part and the histogram are charged too).
RATIO_GUARD = 2.0
DELTA = 1e-5
# MNIST-like (the paper's Fig. 2/3 setting): n = 60000, q = 0.0017 (L = 102), 20 epochs of
# ⌈1/q⌉ = 589 steps, T_K = 20; the paper's σ′_C = 4, i.e. dprelease σ_C = 4√2.
MNIST: dict[str, Any] = dict(n=60_000, batch_size=102, sgd_steps=20 * 589, kmeans_iterations=20)


def _binomial_log_e2(lam: int, sigma: float, q: float) -> float:
    """log E_{μ0}[(μ1/μ0)^{λ+1}] = log Σ_k C(λ+1,k)(1−q)^{λ+1−k} q^k e^{(k²−k)/(2σ²)}, in mpmath."""
    mp.mp.dps = 50
    a = lam + 1
    total = mp.fsum(
        mp.binomial(a, k)
        * (1 - mp.mpf(q)) ** (a - k)
        * mp.mpf(q) ** k
        * mp.e ** (mp.mpf(k * k - k) / (2 * mp.mpf(sigma) ** 2))
        for k in range(a + 1)
    )
    return float(mp.log(total))


# --- paper: the integrals ---------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.4, 1.0, 2.83, 10.0])
@pytest.mark.parametrize("q", [1e-3, 0.0017, 0.05, 0.5])
def test_e2_equals_binomial_closed_form_at_integer_lambda(sigma: float, q: float) -> None:
    for lam in (1, 2, 3, 7, 16, 32, 100, 640):
        _, log_e2 = log_e1_e2(lam, sigma, q)
        expected = _binomial_log_e2(lam, sigma, q)
        assert log_e2 == pytest.approx(expected, rel=1e-10, abs=1e-13)


@pytest.mark.parametrize(
    ("lam", "sigma", "q"),
    [
        (0.7, 10.0, 0.05),
        (0.7, 0.3, 1e-3),
        (3.3, 2.83, 0.5),
        (50.3, 0.5, 0.0017),
        (213.3, 1.0, 0.0017),
    ],
)
def test_e1_e2_match_mpmath_quadrature_at_fractional_lambda(
    lam: float, sigma: float, q: float
) -> None:
    mp.mp.dps = 30
    s, qq = mp.mpf(sigma), mp.mpf(q)

    def ratio(x: mp.mpf) -> mp.mpf:
        return 1 - qq + qq * mp.exp((2 * x - 1) / (2 * s**2))

    e1 = mp.quad(
        lambda x: mp.npdf(x, 0, s) * ratio(x) ** (-lam),
        [-mp.inf, -lam - 20 * s, -lam, 0, 20 * s, mp.inf],
    )
    e2 = mp.quad(
        lambda x: mp.npdf(x, 0, s) * ratio(x) ** (lam + 1),
        [-mp.inf, -20 * s, 0, 1, lam + 1, lam + 1 + 20 * s, mp.inf],
    )
    log_e1, log_e2 = log_e1_e2(lam, sigma, q)
    assert log_e1 == pytest.approx(float(mp.log(e1)), rel=1e-9, abs=1e-14)
    assert log_e2 == pytest.approx(float(mp.log(e2)), rel=1e-9, abs=1e-14)


def test_e1_never_exceeds_e2() -> None:
    # Mironov, Talwar, Zhang 2019: for the sampled Gaussian the μ1‖μ0 direction dominates, so
    # the paper's max(E1, E2) is E2 (checked on the orders Theorem 4 uses).
    for sigma in (0.5, 2.0, 8.0):
        for q in (0.0017, 0.1):
            for lam in (0.3, 1.0, 4.5, 20.0, 200.0):
                log_e1, log_e2 = log_e1_e2(lam, sigma, q)
                assert log_e1 <= log_e2 + 1e-12


@pytest.mark.parametrize("sigma", [0.7, 2.83])
@pytest.mark.parametrize("q", [0.0017, 0.05])
def test_alpha_g_is_lambda_times_poisson_rdp(sigma: float, q: float) -> None:
    # α(λ) = log E[(μ1/μ0)^λ] under μ1 = λ·D_{λ+1}(μ1‖μ0): the moments accountant at a single
    # mechanism (j = 1) is dp_accounting's add/remove Poisson-subsampled Gaussian RDP.
    lams = np.arange(1, 33)
    rdp = _compute_rdp_poisson_subsampled_gaussian(q, sigma, lams + 1.0)
    for lam, r in zip(lams, rdp, strict=True):
        alpha = max(log_e1_e2(float(lam), sigma, q))
        assert alpha == pytest.approx(lam * r, rel=1e-9)


def _alpha_g_quad(lam: float, sigma: float, q: float) -> float:
    """α_G by scipy's adaptive quadrature (independent of the trapezoid code)."""

    def log_ratio(x: float) -> float:
        return float(np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2)))

    def log_f2(x: float) -> float:
        return -x * x / (2 * sigma**2) + (lam + 1) * log_ratio(x)

    def log_f1(x: float) -> float:
        return -x * x / (2 * sigma**2) - lam * log_ratio(x)

    out = []
    for log_f, lo, hi in (
        (log_f1, -lam - 15 * sigma, 15 * sigma),
        (log_f2, -15 * sigma, lam + 1 + 15 * sigma),
    ):
        grid = np.linspace(lo, hi, 2001)
        peak = max(log_f(x) for x in grid)
        breaks = list(grid[::100])
        value, _ = integrate.quad(
            lambda x, f=log_f, top=peak: math.exp(f(x) - top), lo, hi, points=breaks, limit=500
        )
        out.append(peak + math.log(value) - 0.5 * math.log(2 * math.pi * sigma**2))
    return max(out)


def test_theorem4_recomputed_independently() -> None:
    n, L, T_S, T_K = 6000, 60, 2000, 5
    s_sgd, s_km, s_norm = 1.6, 14.0, 5.0
    event = DPGMPaperEvent(n, L, T_S, T_K, s_sgd, s_km, s_norm, rbf=False, lambda_max=12)
    q = L / n
    c, s = s_norm / SQRT2, s_sgd / SQRT2  # the paper's σ′
    k = s_km / SQRT2
    per_lambda = []
    for lam in range(1, 13):
        alpha_k = T_K * (lam**2 + lam) * (1 / (4 * c**2) + 1 / (2 * k**2))  # Eq. 3
        alpha_s = T_S * min(
            j * _alpha_g_quad(lam / j, c, q) + (1 - j) * _alpha_g_quad(lam / (1 - j), s, q)
            for j in HOLDER_WEIGHTS
        )  # Eq. 4
        per_lambda.append((alpha_k + alpha_s - math.log(DELTA)) / lam)  # Theorem 4
    assert event.epsilon(DELTA) == pytest.approx(min(per_lambda), rel=1e-8)
    best = int(np.argmin(per_lambda)) + 1
    assert 1 < best < 12  # an interior λ: the min over λ is doing work here


def test_holder_weights_are_the_papers_ten() -> None:
    assert len(HOLDER_WEIGHTS) == 10
    assert all(0 < j < 1 for j in HOLDER_WEIGHTS)
    # Any j is valid (Theorem 3), and the grid's min is no worse than its end points.
    per_step = alpha_sgd(sigma_norm=2.83, sigma_sgd=1.0, q=0.0017, lambda_max=8)
    single = [
        0.95 * max(log_e1_e2(lam / 0.95, 1.0, 0.0017))
        + 0.05 * max(log_e1_e2(lam / 0.05, 2.83, 0.0017))
        for lam in range(1, 9)
    ]
    assert np.all(per_step <= np.asarray(single) * (1 + 1e-12))


def test_rbf_drops_dpnorm_from_eq3() -> None:
    args = (60_000, 102, 100, 20, 1.5, 20.0, 6.0)
    rbf = DPGMPaperEvent(*args, rbf=True).alpha_kmeans()
    other = DPGMPaperEvent(*args, rbf=False).alpha_kmeans()
    lam = np.arange(1, 33)
    # The paper's σ′ = σ/√2: T_K (λ² + λ)/(2σ′_K²) and, without RBF, + T_K (λ² + λ)/(4σ′_C²).
    np.testing.assert_allclose(rbf, 20 * (lam**2 + lam) / 20.0**2, rtol=1e-12)
    np.testing.assert_allclose(other - rbf, 20 * (lam**2 + lam) / (2 * 6.0**2), rtol=1e-12)


def test_paper_pinned_values() -> None:
    # The text gives no readable Fig. 2 values (only ε = 1.74 at 20 epochs, q = 0.0017, σ′_C = 4,
    # with σ′_K and σ′_G unstated), so these pins are dprelease's own, in the paper's σ′ units
    # (σ = √2·σ′): a regression guard, not a reproduction.
    def eps(sgd: float, km: float) -> float:
        event = DPGMPaperEvent(
            **MNIST, sigma_sgd=sgd * SQRT2, sigma_kmeans=km * SQRT2, sigma_norm=4 * SQRT2
        )
        return event.epsilon(DELTA)

    assert eps(1.0, 20.0) == pytest.approx(1.956886, rel=1e-5)
    assert eps(2.0, 40.0) == pytest.approx(0.897316, rel=1e-5)
    assert eps(1.5, 100.0) == pytest.approx(0.959780, rel=1e-5)


def test_tight_pinned_values() -> None:
    # The same settings under the tight analysis: the proven two-term replace-one pair of
    # ``dpcore.accounting.dpsgd`` (regression pins). While the unproven antipodal pair was
    # charged (dp_accounting's REPLACE_ONE Poisson PLD): 1.637899, 0.786673, 0.714466; the
    # simpler proven pair (P*, Q*) of distance Δ̄ gives 3.128884, 0.946390, 1.167608 here.
    def eps(sgd: float, km: float) -> float:
        event = DPGMEvent(
            **MNIST, sigma_sgd=sgd * SQRT2, sigma_kmeans=km * SQRT2, sigma_norm=4 * SQRT2
        )
        return event.epsilon(DELTA)

    assert eps(1.0, 20.0) == pytest.approx(1.817273, rel=1e-4)
    assert eps(2.0, 40.0) == pytest.approx(0.816359, rel=1e-4)
    assert eps(1.5, 100.0) == pytest.approx(0.806193, rel=1e-4)


# --- tight ------------------------------------------------------------------------------------


@pytest.mark.parametrize("z", [0.5, 1.0, 3.0])
def test_dp_accounting_replace_one_gaussian_doubles_the_shift(z: float) -> None:
    # GaussianPrivacyLoss with AdjacencyType.REPLACE compares N(−1, z²) with N(+1, z²): the
    # noise multiplier is relative to one record's contribution, replaced ones differ by 2.
    accountant = dpa.pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.GaussianDpEvent(z))
    exact = gdp.epsilon_of(2 / z, DELTA)
    assert exact <= accountant.get_epsilon(DELTA) <= exact * (1 + 1e-6)


@pytest.mark.parametrize("rbf", [True, False])
def test_kmeans_part_is_exact_gdp(rbf: bool) -> None:
    event = DPGMEvent(60_000, 100, 0, 20, 1.0, 30.0, 8.0, rbf=rbf)
    mu = math.sqrt(20 * (4 / 30.0**2 + (0 if rbf else 2 / 8.0**2)))
    assert event.kmeans_mu == pytest.approx(mu, rel=1e-14)
    exact = gdp.epsilon_of(mu, DELTA)
    assert exact <= event.epsilon(DELTA) <= exact * (1 + 1e-5)


def test_kmeans_joint_sensitivity_brute_force() -> None:
    """One k-means step as DPGM runs it (``noisy_statistics`` on random Fourier features, sums
    and counts at σ_K each), whitened by the σ's its sampler is handed, moves by at most the
    accountant's per-iteration μ = 2/σ_K (``step_mu2``, ``DPGMEvent.kmeans_mu``) when one
    record is replaced; attained by a record moved between clusters and by antipodal features
    within one (the case the paper's √2·C_s misses). With σ_c = 2σ_K the within-cluster case
    alone sets ``step_mu2``."""
    k, d, clusters, n, sigma = 6, 3, 4, 20, 3.0
    fourier = FourierFeatures.draw(k, d, 0.7, SecureRandom.from_seed(0))
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.uniform(size=(n, k)))
    assignment = torch.as_tensor(rng.integers(clusters, size=n))
    # x′ with x′Ω = xΩ + π: φ(x′) = −φ(x).
    shift = np.linalg.lstsq(fourier.frequencies.numpy().T, np.full(d, math.pi), rcond=None)[0]
    antipodal = X.clone()
    antipodal[0] += torch.as_tensor(shift)
    neighbours = [(antipodal, assignment)]
    for _ in range(40):
        other, moved_to = X.clone(), assignment.clone()
        i = int(rng.integers(n))
        other[i] = torch.as_tensor(rng.uniform(size=k))
        moved_to[i] = int(rng.integers(clusters))
        neighbours.append((other, moved_to))
    event = DPGMEvent(1000, 10, 0, 1, 1.0, sigma, 1.0, rbf=True)
    kmeans_mu = event.kmeans_mu
    assert event.noise().scale("kmeans").sensitivity == pytest.approx(sigma * kmeans_mu)
    for sigma_counts in (sigma, 2 * sigma):
        runs = []
        for rows, assigned in [(X, assignment), *neighbours]:
            recorder = Recorder()
            noisy_statistics(
                rows,
                assigned,
                clusters,
                sigma_sums=sigma,
                sigma_counts=sigma_counts,
                sampler=recorder,
                error=0.0,
                features=fourier,
            )
            runs.append(recorder.calls)
        (sums, s_sums, sens_sums), (counts, s_counts, sens_counts) = runs[0]
        assert (s_sums, sens_sums, s_counts, sens_counts) == (
            sigma,
            FOURIER_SUM_SENSITIVITY,
            sigma_counts,
            COUNT_SENSITIVITY,
        )
        whitened, row_moves, count_moves = [], [], []
        for (sums2, *_), (counts2, *_) in runs[1:]:
            row_moves.append(float((sums2 - sums).norm(dim=1).max()))
            count_moves.append(float((counts2 - counts).abs().max()))
            whitened.append(
                math.sqrt(
                    float(((sums2 - sums) ** 2).sum()) / sigma**2
                    + float(((counts2 - counts) ** 2).sum()) / sigma_counts**2
                )
            )
        assert max(row_moves) <= FOURIER_SUM_SENSITIVITY * (1 + 1e-12)
        assert max(count_moves) <= COUNT_SENSITIVITY
        mu = math.sqrt(step_mu2(sigma_sums=sigma, sigma_counts=sigma_counts, fourier=True))
        assert max(whitened) <= mu * (1 + 1e-12)
        assert whitened[0] == pytest.approx(2 / sigma, rel=1e-9)  # antipodal, one cluster
        if sigma_counts == sigma:
            assert mu == pytest.approx(kmeans_mu, rel=1e-15)
            between = [bool(a.ne(assignment).any()) for _, a in neighbours]
            assert between.count(True) > 5
            for moved in itertools.compress(whitened, between):
                assert moved == pytest.approx(kmeans_mu, rel=1e-12)


def test_adaptive_second_release_is_dominated_by_antipodal_contributions() -> None:
    # The numerical check behind the analysis charged before the proven pair (kept: the
    # accountant no longer relies on it). Conditioned on the histogram release, the gradient
    # release of the same batch is a mixture (1−w)N(0, I) + wN(a, I) against
    # (1−w′)N(0, I) + w′N(b, I) with posterior weights w ≠ w′; its hockey-stick divergence at
    # every threshold is largest for antipodal full-norm a = −b. The proven bound covers the
    # adaptive step directly (``test_adaptive_step_below_the_proven_pair``).
    xs = np.linspace(-8, 8, 321)
    X, Y = np.meshgrid(xs, xs)
    h2 = (xs[1] - xs[0]) ** 2

    def pdf(m: tuple[float, float]) -> np.ndarray:
        return np.exp(-((X - m[0]) ** 2 + (Y - m[1]) ** 2) / 2) / (2 * math.pi)

    r = 1.3
    phi0, pa = pdf((0.0, 0.0)), pdf((r, 0.0))
    for w_p in (0.05, 0.5, 0.95):
        for w_q in (0.05, 0.5, 0.95):
            P = (1 - w_p) * phi0 + w_p * pa
            for gamma in (0.1, 1.0, 8.0):
                anti = (
                    np.sum(np.maximum(P - gamma * ((1 - w_q) * phi0 + w_q * pdf((-r, 0.0))), 0))
                    * h2
                )
                for theta in np.linspace(0, math.pi, 7):
                    for norm in (0.0, 0.6 * r, r):
                        b = (norm * math.cos(theta), norm * math.sin(theta))
                        other = (
                            np.sum(np.maximum(P - gamma * ((1 - w_q) * phi0 + w_q * pdf(b)), 0))
                            * h2
                        )
                        assert other <= anti + 1e-9


def _adaptive_step_delta(q: float, sigma_c: float, sigma_s: float, gamma: float) -> float:
    """H_γ of one DPGM-like step with an adaptive clip, by a 3-D grid integral (whitened).

    Stage 1: a two-bin histogram, record x in bin 0 and x′ in bin 1 (one-hot, noise σ_C).
    Stage 2: the clip C = 1 when the noisy bin 0 wins, else C = 0.5; x's gradient is +0.8 and
    x′'s −0.8, clipped to C and released in units of C (noise σ_S): ±0.8 or ±1 by the first
    release. The others' contributions are a common shift (removed)."""
    h = 0.1
    g1 = np.arange(-7.0, 8.0, h) + h / 2
    g2 = np.arange(-8.0, 8.0, h) + h / 2
    H0, H1, S = np.meshgrid(g1, g1, g2, indexing="ij")
    phi = lambda t: np.exp(-t * t / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    wins0 = H0 > H1
    shift = 1.0 / sigma_c

    def present(bin0: bool, sign: float) -> np.ndarray:
        f = np.where(wins0, 0.8, 1.0) * sign / sigma_s
        hist = phi(H0 - shift) * phi(H1) if bin0 else phi(H0) * phi(H1 - shift)
        return hist * phi(S - f)  # type: ignore[no-any-return]

    absent = phi(H0) * phi(H1) * phi(S)
    p = (1 - q) * absent + q * present(True, 1.0)
    r = (1 - q) * absent + q * present(False, -1.0)
    return float(np.sum(np.maximum(p - gamma * r, 0.0)) * h**3)


@pytest.mark.parametrize("q", [0.3, 1.0])
def test_adaptive_step_below_the_proven_pair(q: float) -> None:
    # The adaptive clip is covered by the theorem (``dpcore.accounting.dpsgd``, 2): presence
    # a = √(1/σ_C² + 1/σ_S²), replacement Δ = √(2/σ_C² + 4/σ_S²); the step's exact δ stays below
    # the pair's curve at every γ (both orders: the step is symmetric under x ↔ x′).
    sigma_c, sigma_s = 1.0, 1.0
    event = DPGMEvent(1000, int(q * 1000), 1, 0, sigma_s, 1.0, sigma_c)
    assert event.sgd_distance == pytest.approx(math.sqrt(2 + 4))
    for gamma in (1.0, 1.5, 3.0, 8.0):
        exact = _adaptive_step_delta(q, sigma_c, sigma_s, gamma)
        two_term = float(
            dpsgd.step_curve(q, event.sgd_present, event.sgd_replaced, math.log(gamma))
        )
        simple = float(dpsgd.step_hockey_stick(q, event.sgd_distance, math.log(gamma)))
        assert exact <= two_term * (1 + 1e-3) + 1e-9
        assert two_term <= simple * (1 + 1e-12)
        if gamma == 1.0:  # not vacuous: at γ = 1 both are q·TV
            assert exact > 0.5 * two_term


class _ProvenPairPRV:
    """The proven pair (P*, Q*) of one step (p = q, distance Δ̄) as a privacy random variable,
    from its definition (``dpcore.accounting.pld``, 4) with scipy only: the loss L(x) =
    log(1 − q + q·e^{Δx − Δ²/2}) of M = (1 − q)N(0, 1) + qN(Δ, 1) against N(0, 1) on x > Δ/2,
    its mirror (mass e^{−l}), the atom at 0. P*(L ≤ t) = 1 − M(L > t) for t ≥ 0 and
    N(0, 1)(L ≥ −t) for t < 0."""

    def __init__(self, q: float, d: float) -> None:
        self.q, self.d = q, d

    def _x(self, t: np.ndarray) -> np.ndarray:  # L(x) = t ≥ 0
        q, d = self.q, self.d
        return (np.log1p(np.expm1(t) / q) + d * d / 2) / d

    def cdf(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        q, d = self.q, self.d
        x = self._x(np.abs(t))
        upper = 1 - (1 - q) * special.ndtr(-x) - q * special.ndtr(d - x)
        return np.where(t >= 0, upper, special.ndtr(-x))

    def probability(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.cdf(b) - self.cdf(a)

    def rdp(self, alpha: float) -> float:
        q, d = self.q, self.d
        x = np.linspace(d / 2, d / 2 + alpha * d + 40, 20_001)
        m = 1 - q + q * np.exp(d * x - d * d / 2)
        dens = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        part = (m**alpha + m ** (1 - alpha)) * dens
        total = float(np.sum(part) * (x[1] - x[0]))
        atom = (1 - q) * (1 - 2 * special.ndtr(-d / 2))
        return math.log(total + atom) / (alpha - 1)


def test_tight_between_independent_prv_accountants_of_two_pairs() -> None:
    # prv_accountant (independent of dp_accounting and of dpcore's PLD code): the charged ε is
    # below the simpler proven pair (P*, Q*)'s and above the antipodal pair the gradients
    # realise (z = σ_S, histogram entries in one bin), k-means part included in both.
    prv_accountant = pytest.importorskip("prv_accountant")
    from prv_accountant.privacy_random_variables import GaussianMechanism, PrivacyRandomVariable

    class ProvenPRV(_ProvenPairPRV, PrivacyRandomVariable):
        pass

    class AntipodalPRV(_AntipodalPRV, PrivacyRandomVariable):
        pass

    event = DPGMEvent(10_000, 100, 1000, 20, 0.9, 60.0, 4.0)
    kmeans = GaussianMechanism(noise_multiplier=1 / event.kmeans_mu)  # add/remove shift 1
    brackets = []
    for step in (ProvenPRV(event.q, event.sgd_distance), AntipodalPRV(event.q, 0.9)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acc = prv_accountant.PRVAccountant(
                prvs=[step, kmeans],
                max_self_compositions=[1000, 1],
                eps_error=0.02,
                delta_error=1e-9,
            )
            brackets.append(acc.compute_epsilon(delta=DELTA, num_self_compositions=[1000, 1]))
    (_, _, simple_high), (antipodal_low, _, _) = brackets
    ours = event.epsilon(DELTA)
    assert antipodal_low <= ours <= simple_high
    assert ours < 0.5 * simple_high  # the two-term pair matters here (z = 0.9)


def test_add_remove_machinery_agrees_with_opacus_and_prv_and_replace_is_larger() -> None:
    # opacus and prv-accountant know add/remove only. They agree with dp_accounting's PLD under
    # ADD_OR_REMOVE_ONE (so the PLD machinery is right); replace-one contains the remove pair
    # (a record replaced by one contributing 0), so the tight ε must lie above that value.
    opacus = pytest.importorskip("opacus.accountants")
    prv_accountant = pytest.importorskip("prv_accountant")
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    z, q, steps = 1.1, 1 / 600, 12_000
    pld = dpa.pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    pld.compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    )
    add_remove = pld.get_epsilon(DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = prv_accountant.PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=z)],
            max_self_compositions=[steps],
            eps_error=0.01,
            delta_error=1e-10,
        )
        low, _, high = prv.compute_epsilon(delta=DELTA, num_self_compositions=[steps])
        rdp = opacus.RDPAccountant()
        rdp.history = [(z, q, steps)]
        opacus_rdp = rdp.get_epsilon(DELTA)
    assert low <= add_remove <= high
    assert add_remove <= opacus_rdp  # RDP is an upper bound on the exact curve
    # Tight SGD part with the same z (σ_C → ∞ is approximated by a huge σ_C):
    tight = DPGMEvent(600, 1, steps, 0, z, 1.0, 1e9).epsilon(DELTA)
    assert tight > add_remove


def test_combined_gaussian_against_separate_composition() -> None:
    # The two releases of one batch as ONE Gaussian is the exact moment of the joint release:
    # it is never above the valid way of composing them separately with a shared batch, the
    # Hölder bound of Theorem 3 (checked here in the add/remove model, where dp_accounting has
    # the RDP of every piece)…
    q, z_c, z_s = 0.01, 4.0, 1.2
    z = (z_c**-2 + z_s**-2) ** -0.5

    def cgf(noise: float, lam: float) -> float:  # α(λ) = λ·RDP(λ + 1)
        return lam * float(_compute_rdp_poisson_subsampled_gaussian(q, noise, [lam + 1.0])[0])

    for lam in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0):
        holder = min(
            j * cgf(z_c, lam / j) + (1 - j) * cgf(z_s, lam / (1 - j)) for j in HOLDER_WEIGHTS
        )
        assert cgf(z, lam) <= holder
    # …while composing them as if their batches were drawn independently would amplify twice
    # and under-report (so it is not a bound for this mechanism): the combined curve is above.
    orders = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    combined = _compute_rdp_poisson_subsampled_gaussian(q, z, orders)
    independent = sum(_compute_rdp_poisson_subsampled_gaussian(q, zz, orders) for zz in (z_c, z_s))
    assert np.all(combined >= independent)

    # The tight event charges one step of both releases as the proven two-term pair
    # (``dpcore.accounting.dpsgd``): presence a = 1/z, replacement Δ = √(2/σ_C² + 4/σ_S²).
    event = DPGMEvent(10_000, 100, 500, 0, z_s, 10.0, z_c)
    assert event.sgd_noise_multiplier == pytest.approx(z, rel=1e-15)
    assert event.sgd_present == pytest.approx(1 / z, rel=1e-15)
    assert event.sgd_replaced == pytest.approx(math.sqrt(2 / z_c**2 + 4 / z_s**2), rel=1e-15)
    expected = dpsgd.epsilon(
        sampling_prob=event.sampling_prob,
        present=event.sgd_present,
        replaced=event.sgd_replaced,
        steps=500,
        delta=DELTA,
        gaussian_mu=0.0,
    )
    assert event.epsilon(DELTA) == expected


class _AntipodalPRV:
    """Privacy loss of (1−q)N(0, z²) + qN(−1, z²) against (1−q)N(0, z²) + qN(+1, z²) for
    prv_accountant (independent of dp_accounting). The DP-SGD phase realises this pair at
    z = σ_S: record x's and x′'s histogram entries in one bin, their clipped gradients ±C (the
    audit's neighbours), so its ε is a lower bound on any valid claim."""

    def __init__(self, q: float, z: float) -> None:
        self.q, self.z = q, z

    def _x_of_loss(self, t: np.ndarray) -> np.ndarray:
        # loss(x) = log(((1−q) + q c/u) / ((1−q) + q c u)), u = e^{x/z²}, c = e^{−1/(2z²)}:
        # e^t q c u² + (e^t − 1)(1 − q) u − q c = 0, positive root in a cancellation-free form.
        q, z = self.q, self.z
        c = math.exp(-1 / (2 * z * z))
        et = np.exp(t)
        b = (et - 1) * (1 - q)
        disc = np.sqrt(b * b + 4 * et * (q * c) ** 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(b >= 0, 2 * q * c / (b + disc), (disc - b) / (2 * et * q * c))
        return z * z * np.log(u)

    def cdf(self, t: np.ndarray) -> np.ndarray:
        x = self._x_of_loss(np.asarray(t, dtype=float))  # the loss decreases in x
        return (1 - self.q) * special.ndtr(-x / self.z) + self.q * special.ndtr(-(x + 1) / self.z)

    def probability(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.cdf(b) - self.cdf(a)

    def rdp(self, alpha: float) -> float:
        q, z = self.q, self.z
        x = np.linspace(-alpha - 40 * z, 40 * z + 2, 100_001)
        log_p = np.logaddexp(
            math.log1p(-q) - x * x / (2 * z * z), math.log(q) - (x + 1) ** 2 / (2 * z * z)
        )
        log_q = np.logaddexp(
            math.log1p(-q) - x * x / (2 * z * z), math.log(q) - (x - 1) ** 2 / (2 * z * z)
        )
        log_int = special.logsumexp(alpha * log_p + (1 - alpha) * log_q) + math.log(x[1] - x[0])
        return float(log_int - 0.5 * math.log(2 * math.pi * z * z)) / (alpha - 1)


def _realisable_bounds(q: float, sigma_sgd: float, steps: int) -> tuple[float, float]:
    """prv_accountant's (lower, upper) bracket of the realisable antipodal pair's ε at δ."""
    prv_accountant = pytest.importorskip("prv_accountant")
    from prv_accountant.privacy_random_variables import PrivacyRandomVariable

    class AntipodalPRV(_AntipodalPRV, PrivacyRandomVariable):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = prv_accountant.PRVAccountant(
            prvs=[AntipodalPRV(q, sigma_sgd)],
            max_self_compositions=[steps],
            eps_error=0.02,
            delta_error=1e-9,
        )
        low, _, high = acc.compute_epsilon(delta=DELTA, num_self_compositions=[steps])
    return float(low), float(high)


@pytest.mark.parametrize(
    ("sgd", "km", "norm"),
    [(1.0, 20.0, 4.0), (2.0, 40.0, 4.0), (1.5, 100.0, 4.0), (0.8, 30.0, 3.0), (3.0, 200.0, 4.0)],
)
def test_tight_above_a_realisable_lower_bound(sgd: float, km: float, norm: float) -> None:
    # σ's in the paper's σ′ units (×√2 for dprelease). The DP-SGD phase alone realises the
    # antipodal gradient pair at z = σ_S (``_AntipodalPRV``): the charged ε is above its lower
    # estimate, and not far above (the k-means part and the histogram are in the charge; the
    # simpler proven pair (P*, Q*) was 1.8–4.7× the realisable ε here).
    args: dict[str, Any] = dict(
        MNIST, sigma_sgd=sgd * SQRT2, sigma_kmeans=km * SQRT2, sigma_norm=norm * SQRT2
    )
    event = DPGMEvent(**args)
    low, high = _realisable_bounds(event.q, event.sigma_sgd, event.sgd_steps)
    assert low <= event.epsilon(DELTA) <= RATIO_GUARD * high


def test_tight_above_paper_when_kmeans_dominates_because_lemma1_halves_the_moment() -> None:
    args: dict[str, Any] = dict(
        MNIST, sigma_sgd=4 * SQRT2, sigma_kmeans=20 * SQRT2, sigma_norm=4 * SQRT2
    )
    tight, paper = DPGMEvent(**args), DPGMPaperEvent(**args)
    assert tight.epsilon(DELTA) > paper.epsilon(DELTA)
    # Why: the exact moment of the k-means Gaussians, λ(λ+1)μ_K²/2, is twice Eq. 3.
    lam = np.arange(1, 33)
    exact_cgf = lam * (lam + 1) * tight.kmeans_mu**2 / 2
    np.testing.assert_allclose(exact_cgf, 2 * paper.alpha_kmeans(), rtol=1e-12)


# --- registry, calibration ----------------------------------------------------------------------

KEYS = {
    "n": 60_000,
    "batch_size": 102,
    "sgd_steps": 5000,
    "kmeans_iterations": 20,
    "sigma_kmeans": 40.0,
    "sigma_norm": 6.0,
}


@pytest.mark.parametrize("name", ["tight", "paper"])
def test_calibration_never_overshoots(name: str) -> None:
    accountant = registry.accountant("dpgm", name)
    for target in (1.0, 3.0) if name == "paper" else (1.0,):
        event = accountant.calibrate(target, DELTA, KEYS)
        assert event.epsilon(DELTA) <= target
        sigma = event.noise().sigma("gradients")
        below = accountant.at_sigma(sigma * (1 - 1e-4), KEYS)
        assert below.epsilon(DELTA) > target


def test_registry_keys_and_description() -> None:
    tight = registry.accountant("dpgm", "tight")
    event = tight.at_sigma(1.5, {**KEYS, "rbf": "false", "d_x": 784, "d_y": 10})
    assert isinstance(event, DPGMEvent)
    assert event.kmeans_iterations == 20 and event.rbf is False
    described = event.describe()
    assert described["mechanism"] == "dpgm" and described["accountant"] == "tight"
    noise = event.noise()
    assert {s.name: s.sigma for s in noise.scales} == {
        "kmeans": 40.0,
        "norm_histogram": 6.0,
        "gradients": 1.5,
    }
    assert noise.calibrated == "gradients"
    cost = event.cost(DELTA)
    assert cost.epsilon == event.epsilon(DELTA) and cost.rdp is None and cost.mu is None
    # rbf=false charges DPNorm in every k-means iteration: strictly more.
    assert event.epsilon(DELTA) > tight.at_sigma(1.5, KEYS).epsilon(DELTA)

    paper = registry.accountant("dpgm", "paper")
    assert not paper.valid_bound and paper.caveat
    assert paper.at_sigma(1.5, {**KEYS, "lambda_max": 16}).describe()["lambda_max"] == 16
    with pytest.raises(ValueError, match="rbf"):
        tight.at_sigma(1.5, {**KEYS, "rbf": "maybe"})
    with pytest.raises(ValueError, match="batch_size"):
        tight.at_sigma(1.5, {**KEYS, "batch_size": 70_000})
    with pytest.raises(ValueError, match="sigma_kmeans"):
        DPGMEvent(100, 10, 10, 1, 1.0, 0.0, 1.0)


def test_coerces_numpy_numbers() -> None:
    n: Any = np.int64(1000)
    sigma: Any = np.float64(1.2)
    event = DPGMEvent(n, np.int64(10).item(), 50, 3, sigma, 20.0, 5.0)
    assert type(event.n) is int and type(event.sigma_sgd) is float
    assert event.epsilon(DELTA) == DPGMEvent(1000, 10, 50, 3, 1.2, 20.0, 5.0).epsilon(DELTA)
