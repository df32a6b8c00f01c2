"""ClustMix accountants: Eq. 8 as printed (`paper`) and the final averaging over a fixed
clustering (`fixed`); the dp variant's `tight` is tested in test_clustmix_dp.py."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from dpcore.accounting import Cost, gdp
from dpcore.accounting.accountant import Accountant
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix.accounting import (
    ClustMixEvent,
    ClustMixPaperEvent,
    means_sensitivity,
)

PAPER = registry.accountant("clustmix", "paper")
FIXED = registry.accountant("clustmix", "fixed")
MNIST = {"cluster_size": 118, "n_classes": 10, "n_features": 784}


def _eq8_mp(eps: float, sigma: float, l: int, C: int, D: int) -> mp.mpf:  # noqa: E741
    """Eq. 8 exactly as printed, in 50-digit arithmetic."""
    mp.mp.dps = 50
    e, s = mp.mpf(eps), mp.mpf(sigma)
    r = mp.sqrt(C * D)
    return mp.ncdf(-e * l * s / r + r / (2 * l * s)) - mp.exp(e) * mp.ncdf(
        -e * l * s / r - r / (2 * l * s)
    )


# ------------------------------------------------------------------------------------------
# paper
# ------------------------------------------------------------------------------------------


def test_paper_mu_formula() -> None:
    event = ClustMixPaperEvent(20, 10, 784, 3.0)
    assert event.mu == pytest.approx(math.sqrt(10 * 784) / (20 * 3.0), rel=1e-15)
    assert event.cost(1e-5) == Cost(epsilon=event.epsilon(1e-5), delta=1e-5, mu=event.mu)
    assert event.cost(1e-5).rdp == gdp.rdp_curve(event.mu)


@pytest.mark.parametrize(
    "case",
    [
        (118, 10, 784, 2.8, 1e-5),
        (20, 10, 784, 72.0, 1e-5),
        (50, 2, 14, 0.05, 1 / 32561),
        (5, 4, 25, 0.3, 1e-3),
    ],
)
def test_paper_delta_of_epsilon_matches_eq8(case: tuple) -> None:  # type: ignore[type-arg]
    l, C, D, sigma, delta = case  # noqa: E741
    event = ClustMixPaperEvent(l, C, D, sigma)
    for eps in (0.01, 0.3, 1.0, 4.0):
        assert event.delta_at(eps) == pytest.approx(
            float(_eq8_mp(eps, sigma, l, C, D)), rel=1e-9, abs=1e-300
        )
    eps = event.epsilon(delta)
    assert _eq8_mp(eps, sigma, l, C, D) <= delta * (1 + 1e-12)
    assert _eq8_mp(eps * (1 - 1e-9), sigma, l, C, D) > delta


def test_paper_reference_numbers() -> None:
    # The paper prints no σ. Its MNIST settings (δ = 1e-5, C = 10, D = 784; ~118 records per
    # mixture at ε = 1, ~20 at ε = 0.2) give, by Eq. 8:
    one = PAPER.calibrate(1.0, 1e-5, MNIST)
    assert one.sigma == pytest.approx(2.79936, rel=1e-5)
    assert one.epsilon(1e-5) <= 1.0
    fifth = PAPER.calibrate(0.2, 1e-5, {**MNIST, "cluster_size": 20})
    assert fifth.sigma == pytest.approx(72.1815, rel=1e-5)
    assert fifth.epsilon(1e-5) <= 0.2


# ------------------------------------------------------------------------------------------
# fixed: the sensitivity of the cluster-means vector
# ------------------------------------------------------------------------------------------


def _clip(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1.0)  # type: ignore[no-any-return]


def _means(points: np.ndarray, assign: np.ndarray, k: int) -> np.ndarray:
    return np.stack([points[assign == c].mean(axis=0) for c in range(k)])


def test_sensitivity_formula() -> None:
    assert means_sensitivity(1) == 2.0
    assert means_sensitivity(2) == 1.0
    for ell in (3, 5, 20, 118):
        assert means_sensitivity(ell) == pytest.approx(2 * math.sqrt(2) / (ell + 1))
        assert means_sensitivity(ell) > 2 / ell


@pytest.mark.parametrize("ell", [1, 2, 3, 5])
def test_sensitivity_brute_force(ell: int) -> None:
    """Random small datasets with a FIXED assignment rule (each record's cluster depends on
    the record alone): the cluster-means vector never moves by more than the claimed
    sensitivity over random and adversarial replacements, and the bound is attained."""
    rng = np.random.default_rng(ell)
    bound = means_sensitivity(ell)
    k, d = 3, 2
    worst = 0.0
    trials = 0
    while trials < 3000:
        n = int(rng.integers(k * ell + 1, k * ell + 6))
        X = _clip(rng.normal(size=(n, d)) * rng.uniform(0.2, 3))
        cluster = rng.integers(0, k, size=n)  # fixed assignment of each record
        i = int(rng.integers(n))
        # The replacement: a fresh record that lands in a random (possibly the same) cluster.
        x_new = _clip(rng.normal(size=d) * rng.uniform(0.2, 3))
        new_cluster = cluster.copy()
        new_cluster[i] = int(rng.integers(k))
        Y = X.copy()
        Y[i] = x_new
        sizes_before = np.bincount(cluster, minlength=k)
        sizes_after = np.bincount(new_cluster, minlength=k)
        if sizes_before.min() < ell or sizes_after.min() < ell:
            continue  # outside the public lower bound, in either neighbour
        trials += 1
        change = np.linalg.norm(_means(X, cluster, k) - _means(Y, new_cluster, k))
        worst = max(worst, float(change))
        assert change <= bound + 1e-12
    # Adversarial: x = e1 against ℓ records at −e1 moves to a cluster of ℓ records at −e2,
    # as x′ = e2; or (stay case) x = e1 replaced by x′ = −e1 in a cluster of ℓ.
    e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    X = np.vstack([e1, np.tile(-e1, (ell, 1)), np.tile(-e2, (ell, 1))])
    cluster = np.array([0] * (ell + 1) + [1] * ell)
    Y, moved = X.copy(), cluster.copy()
    Y[0], moved[0] = e2, 1
    move = np.linalg.norm(_means(X, cluster, 2) - _means(Y, moved, 2))
    assert move == pytest.approx(2 * math.sqrt(2) / (ell + 1))
    X2 = np.vstack([e1, np.tile(e1, (ell - 1, 1))])
    Y2 = X2.copy()
    Y2[0] = -e1
    stay = np.linalg.norm(X2.mean(axis=0) - Y2.mean(axis=0))
    assert stay == pytest.approx(2 / ell)
    assert max(move, stay) == pytest.approx(bound)
    assert worst <= bound


def test_fixed_is_gdp_with_mu_sensitivity_over_sigma() -> None:
    event = FIXED.at_sigma(0.5, {"cluster_size": 20})
    assert isinstance(event, ClustMixEvent)
    assert event.mu == pytest.approx(2 * math.sqrt(2) / 21 / 0.5)
    assert event.epsilon(1e-5) == gdp.epsilon_of(event.mu, 1e-5)
    cost = event.cost(1e-5)
    assert cost.mu == event.mu and cost.rdp == gdp.rdp_curve(event.mu)
    # n_classes and n_features are accepted and do not change the bound.
    same = FIXED.at_sigma(0.5, {"cluster_size": 20, "n_classes": 10, "n_features": 784})
    assert same.epsilon(1e-5) == event.epsilon(1e-5)
    d = event.describe()
    assert d["mechanism"] == "clustmix" and d["accountant"] == "fixed"
    assert "charged separately" in d["covers"]
    assert (event.noise().sigma_x, event.noise().sigma_y) == (0.5, None)


def test_fixed_reference_number() -> None:
    # MNIST-like: l = 118, ε = 1, δ = 1e-5 → Δ = 2√2/119, σ = Δ/μ(1, 1e-5).
    event = FIXED.calibrate(1.0, 1e-5, {"cluster_size": 118})
    assert event.sigma == pytest.approx(0.0886708, rel=1e-5)


def test_fixed_is_monotone() -> None:
    eps = [FIXED.at_sigma(s, {"cluster_size": 10}).epsilon(1e-5) for s in (0.01, 0.1, 1, 10)]
    assert all(a > b for a, b in itertools.pairwise(eps))
    by_l = [FIXED.at_sigma(0.1, {"cluster_size": c}).epsilon(1e-5) for c in (2, 5, 50, 500)]
    assert all(a > b for a, b in itertools.pairwise(by_l))


@pytest.mark.parametrize("acc", [PAPER, FIXED])
@pytest.mark.parametrize("target", [0.05, 1.0, 10.0])
def test_calibration_never_overshoots(acc: Accountant, target: float) -> None:
    event = acc.calibrate(target, 1e-6, MNIST)
    assert event.epsilon(1e-6) <= target
    assert acc.at_sigma(event.sigma * (1 - 1e-5), MNIST).epsilon(1e-6) > target


@pytest.mark.parametrize(
    ("acc", "keys", "message"),
    [
        (PAPER, {"cluster_size": 10, "n_classes": 2}, "needs key n_features"),
        (PAPER, {**MNIST, "n": 100}, "unknown key"),
        (PAPER, {**MNIST, "cluster_size": 2.5}, "integer"),
        (PAPER, {**MNIST, "n_classes": 0}, "n_classes must be >= 1"),
        (FIXED, {"n_classes": 2}, "needs key cluster_size"),
        (FIXED, {"cluster_size": 0}, "cluster_size must be >= 1"),
    ],
)
def test_key_errors_are_clear(acc: Accountant, keys: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        acc.at_sigma(1.0, keys)


def test_sigma_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sigma"):
        ClustMixEvent(10, 0.0)
    with pytest.raises(ValueError, match="sigma"):
        ClustMixPaperEvent(10, 2, 3, math.inf)


def test_paper_is_flagged_as_not_a_valid_bound() -> None:
    assert not PAPER.valid_bound and PAPER.caveat
    # The fixed-clustering bound is sound for its setting, which no release meets (a release
    # clusters its own data): it is for comparison only, refused for releases.
    assert not FIXED.valid_bound and "clustering" in FIXED.caveat
    assert registry.accountant("clustmix", "tight").valid_bound


# ------------------------------------------------------------------------------------------
# variant paper: l_min from σ_max (Algorithm 2 line 2), σ_t per cluster (line 16)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epsilon", "delta", "sigma_max"), [(1.0, 1e-5, 3.0), (0.2, 1e-5, 50.0), (8.0, 1e-6, 0.5)]
)
def test_sigma_max_gives_the_least_cluster_size_that_meets_it(
    epsilon: float, delta: float, sigma_max: float
) -> None:
    keys = {"sigma_max": sigma_max, "n_classes": 10, "n_features": 784}
    event = PAPER.calibrate(epsilon, delta, keys)
    ell = event.cluster_size
    assert event.sigma <= sigma_max and event.epsilon(delta) <= epsilon
    # One record fewer per cluster would need more noise than σ_max at this (ε, δ), by Eq. 8
    # evaluated independently in 50 digits.
    assert _eq8_mp(epsilon, sigma_max, ell - 1, 10, 784) > delta
    assert _eq8_mp(epsilon, sigma_max, ell, 10, 784) <= delta
    # The l_min used travels with the release's parameters.
    assert event.noise().analysis == {"cluster_size": float(ell)}


def test_paper_needs_a_cluster_size_or_sigma_max() -> None:
    keys = {"n_classes": 10, "n_features": 784}
    with pytest.raises(ValueError, match="cluster_size"):
        PAPER.calibrate(1.0, 1e-5, keys)
    with pytest.raises(ValueError, match="cluster_size"):
        PAPER.at_sigma(3.0, keys)
    # Given, cluster_size wins over sigma_max.
    event = PAPER.calibrate(1.0, 1e-5, {**keys, "cluster_size": 118, "sigma_max": 0.1})
    assert event.cluster_size == 118


def test_each_clusters_noise_keeps_eq8s_mu() -> None:
    event = PAPER.calibrate(1.0, 1e-5, MNIST)
    for size in (118, 119, 200, 1000):
        sigma_t = event.cluster_sigma(size)
        assert ClustMixPaperEvent(size, 10, 784, sigma_t).mu == pytest.approx(event.mu, rel=1e-12)
    with pytest.raises(ValueError):
        event.cluster_sigma(117)


def test_fixed_is_offline_only_and_each_accountant_takes_its_variant() -> None:
    spec = registry.get("clustmix")
    assert FIXED.releases is False and PAPER.releases is True and not PAPER.valid_bound
    assert spec.accountant("tight").assumes["variant"] == "dp"
    assert PAPER.assumes["variant"] == "paper"
