"""Accountants of the random-mixing paper's baselines: local perturbation and random projection."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from dpcore.accounting import Cost, compose_epsilon, gdp
from dpcore.accounting.per_record import FEATURE_SENSITIVITY, LABEL_SENSITIVITY
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpmix.accounting_paper import DPMixPaperEvent
from dpcore.mechanisms.local_perturbation.accounting import (
    LocalPerturbationEvent,
    LocalPerturbationPaperEvent,
)
from dpcore.mechanisms.local_perturbation.generate import local_perturbation
from dpcore.mechanisms.random_projection.accounting import (
    RandomProjectionEvent,
    RandomProjectionPaperEvent,
    paper_epsilon,
    paper_sigma,
)
from dpcore.mechanisms.random_projection.generate import projection_matrix, random_projection
from dpcore.mechanisms.secure_random import SecureRandom
from tests.unit.test_noise_sensitivity import Recorder

DELTA = 1e-5


def _delta_mp(mu: float, eps: float) -> mp.mpf:
    """δ(ε) of μ-GDP, Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), in 50-digit arithmetic."""
    mp.mp.dps = 50
    m, e = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(-e / m + m / 2) - mp.e**e * mp.ncdf(-e / m - m / 2)


def _assert_is_gdp_epsilon(eps: float, mu: float, delta: float) -> None:
    # ε meets δ (a valid bound, up to gdp.py's double-precision evaluation of δ(ε): a relative
    # 1e-12, far inside the ledger's 1e-9 slack) and is the smallest such ε up to 1e-9.
    assert _delta_mp(mu, eps) <= delta * (1 + 1e-12)
    assert _delta_mp(mu, eps * (1 - 1e-9)) > delta


def _records(rng: np.random.Generator, count: int, d: int) -> np.ndarray:
    """Preprocessed records: coordinates in [0, 1], L2 norm ≤ 1 (some sparse, some on the
    sphere)."""
    x = rng.uniform(size=(count, d)) * (
        rng.uniform(size=(count, d)) < rng.uniform(0.05, 1, (count, 1))
    )
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))


# --- local perturbation -----------------------------------------------------------------------


@pytest.mark.parametrize(("sx", "sy"), [(1.0, 1.0), (4.0, 2.0), (0.5, 8.0), (30.0, 30.0)])
def test_local_tight_is_the_gaussian_mechanism(sx: float, sy: float) -> None:
    event = LocalPerturbationEvent(1000, sx, sy)
    mu = math.sqrt(2 / sx**2 + 2 / sy**2)
    assert event.mu == pytest.approx(mu, rel=1e-15)
    for delta in (1e-5, 1e-8):
        _assert_is_gdp_epsilon(event.epsilon(delta), mu, delta)
    cost = event.cost(DELTA)
    assert cost.mu == pytest.approx(mu) and cost.rdp is not None


def _moves(recorder: Recorder, other: Recorder) -> tuple[np.ndarray, np.ndarray, set[float]]:
    """Row-wise distances between what two runs handed their samplers (features, labels) and
    the sensitivities declared for the features."""
    features, labels = recorder.calls[0::2], recorder.calls[1::2]
    features2, labels2 = other.calls[0::2], other.calls[1::2]
    assert {c[2] for c in labels + labels2} == {LABEL_SENSITIVITY}
    x = torch.cat([c[0] for c in features]) - torch.cat([c[0] for c in features2])
    y = torch.cat([c[0] for c in labels]) - torch.cat([c[0] for c in labels2])
    declared = {c[2] for c in features + features2}
    return x.norm(dim=1).numpy(), y.norm(dim=1).numpy(), declared


def _neighbour_rows(rng: np.random.Generator, d: int) -> tuple[torch.Tensor, ...]:
    """Rows k of the two returned feature (and label) sets are replace-one neighbours (only
    that released row changes): random unit-scale records, then two orthogonal unit ones."""
    x = _records(rng, 3000, d)
    pairs = rng.integers(3000, size=(20_000, 2))
    e = np.eye(d)
    first = np.vstack([x[pairs[:, 0]], e[:1]])
    second = np.vstack([x[pairs[:, 1]], e[1:2]])
    labels = np.eye(3)[rng.integers(3, size=(len(first), 2))]
    labels[-1] = np.eye(3)[[0, 1]]
    return (
        torch.as_tensor(first),
        torch.as_tensor(labels[:, 0]),
        torch.as_tensor(second),
        torch.as_tensor(labels[:, 1]),
    )


def test_record_sensitivity_brute_force() -> None:
    """The sensitivities local perturbation declares to its sampler cover every replace-one
    move of unit-scale records and one-hot labels, and are attained."""
    x, y, x2, y2 = _neighbour_rows(np.random.default_rng(1), 12)
    runs = [Recorder(), Recorder()]
    for features, labels, recorder in ((x, y, runs[0]), (x2, y2, runs[1])):
        for _ in local_perturbation(
            features,
            labels,
            sigma_x=1.0,
            sigma_y=1.0,
            generator=SecureRandom.from_seed(0),
            noise=recorder,
        ):
            pass
    moved_x, moved_y, declared = _moves(*runs)
    assert declared == {FEATURE_SENSITIVITY}
    assert moved_x.max() <= FEATURE_SENSITIVITY * (1 + 1e-12)
    assert moved_y.max() <= LABEL_SENSITIVITY * (1 + 1e-12)
    # Attained by two orthogonal unit records; one-hot labels always differ by √2.
    assert moved_x[-1] == pytest.approx(FEATURE_SENSITIVITY, rel=1e-12)
    assert moved_y[-1] == pytest.approx(LABEL_SENSITIVITY, rel=1e-12)


def test_local_paper_is_dpmix_theorem1_with_one_record_per_mixture() -> None:
    event = LocalPerturbationPaperEvent(60_000, 30.0, 30.0, 784, 10)
    expected = DPMixPaperEvent(60_000, 1, 60_000, 30.0, 30.0, 784, 10).epsilon(DELTA)
    assert event.epsilon(DELTA) == expected
    assert event.describe()["mechanism"] == "local_perturbation"
    assert event.cost(DELTA).rdp is None


@pytest.mark.parametrize(("dx", "dy", "sigma"), [(2, 2, 2.0), (1, 2, 1.0), (4, 2, 3.0)])
def test_local_paper_reading_is_not_a_valid_bound(dx: int, dy: int, sigma: float) -> None:
    # Every record is released once, so a record is in the output with probability 1; the
    # "uniformly drawn rows" reading amplifies by 1/n and reports far less than the exact ε of
    # the Gaussian mechanism that is actually run (low-dimensional data, where d_x is no penalty).
    paper = LocalPerturbationPaperEvent(60_000, sigma, sigma, dx, dy).epsilon(DELTA)
    exact = LocalPerturbationEvent(60_000, sigma, sigma).epsilon(DELTA)
    assert paper < exact / 2
    assert not registry.accountant("local_perturbation", "paper").valid_bound


# --- random projection ------------------------------------------------------------------------


@pytest.mark.parametrize(("d", "d_x", "s"), [(3, 8, 1.0), (8, 8, 2.5), (5, 20, 0.3)])
def test_projection_sensitivity_brute_force(d: int, d_x: int, s: float) -> None:
    """projection_matrix has spectral norm s, and the sensitivity random_projection declares
    to its sampler (√2·s) covers every replace-one move of the projected rows."""
    R = projection_matrix(d, d_x, s, generator=SecureRandom.from_seed(d * 100 + d_x))
    assert torch.linalg.matrix_norm(R, ord=2).item() == pytest.approx(s, rel=1e-12)
    x, y, x2, y2 = _neighbour_rows(np.random.default_rng(d * 100 + d_x), d_x)
    runs = [Recorder(), Recorder()]
    for features, labels, recorder in ((x, y, runs[0]), (x2, y2, runs[1])):
        matrix, chunks = random_projection(
            features,
            labels,
            projection_dim=d,
            spectral_norm=s,
            sigma_x=1.0,
            sigma_y=1.0,
            generator=SecureRandom.from_seed(d * 100 + d_x),
            noise=recorder,
        )
        assert torch.equal(matrix, R)
        for _ in chunks:
            pass
    moved_x, moved_y, declared = _moves(*runs)
    assert declared == {FEATURE_SENSITIVITY * s}
    assert moved_x.max() <= FEATURE_SENSITIVITY * s * (1 + 1e-12)
    assert moved_y.max() <= LABEL_SENSITIVITY * (1 + 1e-12)
    # The bound is attained when the top right singular vector is (e_1 − e_2)/√2.
    rng = np.random.default_rng(d)
    u, _, vt = np.linalg.svd(rng.normal(size=(d, d_x)))
    v = np.zeros(d_x)
    v[:2] = (1 / math.sqrt(2), -1 / math.sqrt(2))
    basis = np.linalg.qr(np.column_stack([v, vt[1:].T]))[0]
    sing = np.linspace(s, s / 3, min(d, d_x))
    R2 = (u[:, : len(sing)] * sing) @ (basis[:, : len(sing)].T * np.sign(basis[:, :1].T @ v)[0])
    assert np.linalg.norm(R2, ord=2) == pytest.approx(s, rel=1e-12)
    e = np.eye(d_x)
    assert np.linalg.norm(R2 @ (e[0] - e[1])) == pytest.approx(FEATURE_SENSITIVITY * s, rel=1e-12)


@pytest.mark.parametrize(("s", "sigma", "sy"), [(1.0, 4.0, 4.0), (2.0, 3.0, 10.0), (0.5, 1.0, 2.0)])
def test_projection_tight_is_the_gaussian_mechanism(s: float, sigma: float, sy: float) -> None:
    event = RandomProjectionEvent(500, 16, s, sigma, sy)
    mu = math.sqrt(2 * s**2 / sigma**2 + 2 / sy**2)
    assert event.mu == pytest.approx(mu, rel=1e-15)
    _assert_is_gdp_epsilon(event.epsilon(DELTA), mu, DELTA)
    # With s = 1 it is local perturbation's bound: the projection adds no privacy.
    if s == 1.0:
        assert event.epsilon(DELTA) == LocalPerturbationEvent(500, sigma, sy).epsilon(DELTA)


@pytest.mark.parametrize("formula", ["sqrt_sum", "sqrt_log"])
@pytest.mark.parametrize("delta", [1e-5, 1e-3, 0.2])
def test_paper_formula_inversion(formula: str, delta: float) -> None:
    for eps in (0.1, 0.7, 1.0, 3.0, 12.0):
        ratio = paper_sigma(eps, delta, formula)
        assert paper_epsilon(ratio, delta, formula) == pytest.approx(eps, rel=1e-12)
        # …and against a numerical root of the printed σ(ε) = ratio.
        root = brentq(
            lambda e, r=ratio: paper_sigma(e, delta, formula) - r, 1e-6, 1e6, xtol=1e-14, rtol=1e-14
        )
        assert paper_epsilon(ratio, delta, formula) == pytest.approx(root, rel=1e-10)
    log_term = math.log(1 / (2 * delta))
    assert paper_epsilon(2.0, delta, "sqrt_sum") == pytest.approx(
        (1 + math.sqrt(1 + 16 * log_term)) / 8
    )
    assert paper_epsilon(2.0, delta, "sqrt_log") == pytest.approx(math.sqrt(log_term))
    assert paper_epsilon(1.0, delta, "sqrt_log") == math.inf
    with pytest.raises(ValueError, match="1/2"):
        paper_epsilon(2.0, 0.5, formula)


def test_paper_projection_event_combines_features_and_labels() -> None:
    event = RandomProjectionPaperEvent(100, 10, 2.0, 6.0, 3.0)
    ratio = 1 / math.sqrt((2.0 / 6.0) ** 2 + 1 / 3.0**2)
    assert event.ratio == pytest.approx(ratio, rel=1e-15)
    assert event.epsilon(DELTA) == pytest.approx(paper_epsilon(ratio, DELTA), rel=1e-15)
    # Labels with huge noise leave the printed features-only formula.
    features_only = RandomProjectionPaperEvent(100, 10, 2.0, 6.0, 1e9)
    assert features_only.epsilon(DELTA) == pytest.approx(paper_epsilon(3.0, DELTA), rel=1e-9)


@pytest.mark.parametrize("ratio", [2.0, 4.0, 8.0])
def test_printed_formula_is_below_the_exact_gaussian_even_in_its_own_convention(
    ratio: float,
) -> None:
    # Sensitivity s (‖x − x′‖ ≤ 1, the paper's convention): exact ε of N(0, (r s)²) is μ-GDP with
    # μ = 1/r. The printed formula lacks the √2 of the cited bound and reports less…
    assert paper_epsilon(ratio, DELTA, "sqrt_sum") < gdp.epsilon_of(1 / ratio, DELTA)
    # …and the cited bound itself, σ = s√(2(log(1/(2δ)) + ε))/ε, is valid there.
    log_term = math.log(1 / (2 * DELTA))
    cited = (1 + math.sqrt(1 + 2 * ratio**2 * log_term)) / ratio**2
    assert math.sqrt(2 * (log_term + cited)) / cited == pytest.approx(ratio, rel=1e-12)
    assert cited >= gdp.epsilon_of(1 / ratio, DELTA)
    # Under replace-one the shift is √2·s: the tight ε is larger still.
    tight = RandomProjectionEvent(10, 5, 1.0, ratio, 1e9).epsilon(DELTA)
    assert tight > gdp.epsilon_of(1 / ratio, DELTA)


# --- registry, calibration ----------------------------------------------------------------------

CASES = [
    ("local_perturbation", "tight", {"n": 1000}),
    ("local_perturbation", "paper", {"n": 1000, "d_x": 4, "d_y": 3}),
    ("random_projection", "tight", {"n": 1000, "projection_dim": 20, "spectral_norm": 2.0}),
    ("random_projection", "paper", {"n": 1000, "projection_dim": 20, "spectral_norm": 2.0}),
    ("random_projection", "paper", {"n": 1000, "projection_dim": 20, "formula": "sqrt_log"}),
]


@pytest.mark.parametrize(("mechanism", "name", "keys"), CASES)
def test_calibration_never_overshoots(mechanism: str, name: str, keys: dict) -> None:  # type: ignore[type-arg]
    accountant = registry.accountant(mechanism, name)
    for target in (0.5, 2.0, 8.0):
        for extra in ({}, {"noise_ratio": 3.0}, {"sigma_y": 50.0}):
            event = accountant.calibrate(target, DELTA, {**keys, **extra})
            assert event.epsilon(DELTA) <= target
            sigma = event.noise().sigma_x
            assert (
                accountant.at_sigma(sigma * (1 - 1e-5), {**keys, **extra}).epsilon(DELTA) > target
            )
            if "noise_ratio" in extra:
                assert event.noise().sigma_y == pytest.approx(3.0 * sigma)
            if "sigma_y" in extra:
                assert event.noise().sigma_y == 50.0


def test_tight_calibration_is_the_closed_form() -> None:
    # μ-GDP with μ = √(2s² + 2/ρ²)/σ: σ = √(2s² + 2/ρ²)/μ*(ε, δ).
    event = registry.accountant("random_projection", "tight").calibrate(
        1.0, DELTA, {"n": 10, "projection_dim": 3, "spectral_norm": 2.0, "noise_ratio": 0.5}
    )
    expected = math.sqrt(2 * 4 + 2 / 0.25) / gdp.mu_for_epsilon(1.0, DELTA)
    assert event.noise().sigma_x == pytest.approx(expected, rel=2e-6)


def test_descriptions_and_ledger_costs() -> None:
    local = registry.accountant("local_perturbation", "tight").at_sigma(
        5.0, {"n": 10, "d_x": 3, "d_y": 2}
    )
    projection = registry.accountant("random_projection", "tight").at_sigma(
        5.0, {"n": 10, "projection_dim": 2, "d_x": 3, "d_y": 2}
    )
    for event, mechanism in ((local, "local_perturbation"), (projection, "random_projection")):
        described = event.describe()
        assert described["mechanism"] == mechanism and described["accountant"] == "tight"
        assert [s.name for s in event.noise().scales] == ["features", "labels"]
    costs = [local.cost(DELTA), projection.cost(DELTA)]
    mu = math.hypot(local.mu, projection.mu)  # type: ignore[attr-defined]
    assert compose_epsilon(costs, delta=DELTA) == pytest.approx(
        gdp.epsilon_of(mu, DELTA), rel=1e-12
    )
    assert isinstance(costs[0], Cost)
    for mechanism in ("local_perturbation", "random_projection"):
        assert registry.accountant(mechanism, "tight").valid_bound
        assert not registry.accountant(mechanism, "paper").valid_bound
    with pytest.raises(ValueError, match="formula"):
        registry.accountant("random_projection", "paper").at_sigma(
            1.0, {"n": 10, "projection_dim": 2, "formula": "x"}
        )
    with pytest.raises(ValueError, match="d_x"):
        registry.accountant("local_perturbation", "paper").at_sigma(1.0, {"n": 10, "d_y": 2})
    with pytest.raises(ValueError, match="spectral_norm"):
        RandomProjectionEvent(10, 2, 0.0, 1.0, 1.0)
