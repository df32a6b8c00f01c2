"""DP k-means on random Fourier features (shared by ClustMix's feature_map rff and DPGM): the
features, a step's sensitivity against worst-case neighbours, the accountant's scales."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.kmeans import (
    Centres,
    FourierFeatures,
    assign,
    noisy_statistics,
    step_mu2,
)
from dpcore.mechanisms.secure_random import SecureRandom

pytestmark = pytest.mark.unit

TIGHT = registry.accountant("clustmix", "tight")
KEYS = {"clusters_per_class": 16, "kmeans_refine": 1, "kmeans_share": 0.5, "count_share": 0.1}


def _features(k: int = 4, d: int = 64, width: float = 0.5) -> FourierFeatures:
    return FourierFeatures.draw(k, d, width, SecureRandom.from_seed(1))


def test_features_have_norm_one_and_estimate_the_rbf_kernel() -> None:
    phi = FourierFeatures.draw(3, 20000, 0.5, SecureRandom.from_seed(2))
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.uniform(-1, 1, (5, 3)) / 2)
    f = phi(x)
    assert f.shape == (5, 40000) and phi.dim == 40000
    assert torch.allclose(f.norm(dim=1), torch.ones(5, dtype=torch.float64), atol=1e-12)
    exact = torch.exp(-(torch.cdist(x, x) ** 2) / (2 * 0.25))
    # Monte-Carlo with 20 000 frequencies: within a few 1/√d.
    assert torch.allclose(f @ f.T, exact, atol=0.03)


def _stats(Z: torch.Tensor, groups: torch.Tensor, centres: Centres, phi: FourierFeatures):
    a = assign(Z, groups, centres, chunk=3, features=phi)
    sums, counts = noisy_statistics(
        Z,
        a,
        len(centres),
        sigma_sums=2.0,
        sigma_counts=2.0,
        sampler=lambda values, **_: values,
        error=0.0,
        features=phi,
        chunk=5,
    )
    return torch.cat([sums.ravel() / 2.0, counts / 2.0])


def test_a_step_on_features_moves_a_sum_by_up_to_two() -> None:
    """Within a cluster, features of opposite sign move one sum by ≈ 2 (√2 for records): the
    μ² = max(4/σ_s², 2/σ_s² + 2/σ_c²) the accountant charges is approached and never passed."""
    bound = math.sqrt(step_mu2(sigma_sums=2.0, sigma_counts=2.0, fourier=True))
    assert bound == pytest.approx(math.sqrt(4 / 4.0))
    phi = _features(k=1, d=1, width=1.0)
    omega = float(phi.frequencies[0, 0])
    # x and x′ with ω(x′ − x) = π: φ(x′) = −φ(x), both in the one cluster of class 0.
    centres = Centres(torch.zeros((1, 2), dtype=torch.float64), torch.tensor([0]))
    rng = np.random.default_rng(3)
    others = torch.as_tensor(rng.uniform(-1, 1, (9, 1)))
    groups = torch.zeros(10, dtype=torch.int64)
    Z = torch.cat([torch.tensor([[0.0]], dtype=torch.float64), others])
    Zp = Z.clone()
    Zp[0, 0] = math.pi / omega
    moved = float((_stats(Z, groups, centres, phi) - _stats(Zp, groups, centres, phi)).norm())
    assert moved == pytest.approx(bound, rel=1e-9)
    # Random neighbours in several clusters and classes never pass it.
    phi = _features()
    centres = Centres(
        phi(torch.as_tensor(rng.uniform(-0.5, 0.5, (4, 4)))), torch.tensor([0, 0, 1, 1])
    )
    Z = torch.as_tensor(rng.uniform(-0.5, 0.5, (30, 4)))
    groups = torch.as_tensor(rng.integers(0, 2, 30))
    base = _stats(Z, groups, centres, phi)
    for _ in range(200):
        Zp, gp = Z.clone(), groups.clone()
        Zp[0] = torch.as_tensor(rng.uniform(-0.5, 0.5, 4))
        gp[0] = int(rng.integers(0, 2))
        assert float((base - _stats(Zp, gp, centres, phi)).norm()) <= bound * (1 + 1e-12)


def test_feature_steps_are_charged_four_over_sigma_squared() -> None:
    keys = {**KEYS, "feature_map": "rff"}
    event = TIGHT.at_sigma(3.0, keys)
    assert isinstance(event, ClustMixDPEvent) and event.fourier
    s = event.scales()
    # The counts ride free: same σ as the sums.
    assert s["kmeans_counts"] == s["kmeans_sums"]
    final = 2 / s["sums"] ** 2 + 2 / s["counts"] ** 2
    kmeans = event.kmeans_steps * 4 / s["kmeans_sums"] ** 2
    assert event.mu == pytest.approx(math.sqrt(final + kmeans), rel=1e-12)
    # The k-means share is what it says.
    assert kmeans / (final + kmeans) == pytest.approx(0.5)
    declared = {n.name: n.sensitivity for n in event.noise().scales}
    assert declared["kmeans_sums"] == 2.0 and declared["sums"] == 1.0


@pytest.mark.parametrize("target", [0.5, 4.0])
def test_feature_calibration_never_overshoots(target: float) -> None:
    keys = {**KEYS, "feature_map": "rff"}
    event = TIGHT.calibrate(target, 1e-5, keys)
    assert event.epsilon(1e-5) <= target
    assert TIGHT.at_sigma(event.sigma * (1 - 1e-6), keys).epsilon(1e-5) > target


def test_sum_error_covers_perturbed_inputs() -> None:
    phi = _features()
    rng = np.random.default_rng(4)
    x = torch.as_tensor(rng.uniform(-0.5, 0.5, (50, 4)))
    e = 1e-9
    bump = torch.as_tensor(rng.normal(size=(50, 4)))
    bump = bump / bump.norm(dim=1, keepdim=True) * e
    moved = (phi(x) - phi(x + bump)).norm(dim=1).max()
    assert float(moved) <= phi.sum_error(e, terms=1)
