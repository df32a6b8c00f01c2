"""The secure sampler's rounding cover keeps the charged ε of every DP-SGD, DP-KIP and Fourier
k-means step (docs/privacy.md, "Hardened noise").

For each noise of a release calibrated to ε = 1 at MNIST-10k shapes (n = 10 000, d = 784,
DPGM's VAE of the default size, one network per cluster), the test plans the sampler as the
mechanism calls it and computes here, independently of the accountants, the noise the rounded
rows actually see: rounding and float error move a distance a by at most b = e + g√d, so a
step analysed for distances of at least u (one record's contribution, 1, for the
Poisson-subsampled sums; the smaller row move, 1, for the k-means steps) has true noise
σ_true = σ'·u/(u + b) in the analysis's units. Its ε — with dp_accounting directly for DPGM
and DP-KIP, and the step's μ for the k-means — must not exceed the reported ε. The same
computation with the Δ-relative cover (σ' = σ(1 + b/Δ), the old rule) exceeds it, or (DP-KIP,
whose charged pair is looser than dp_accounting's antipodal one) leaves the rounded sums less
noise than the accountant was given: the test can fail.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import dp_accounting as dpa
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from dpcore.mechanisms import float_error, registry
from dpcore.mechanisms.clustmix import dpkip
from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpgm.models import VAE
from dpcore.mechanisms.kmeans import (
    COUNT_SENSITIVITY,
    FOURIER_SUM_SENSITIVITY,
    SUM_ROW_SENSITIVITY,
    SUM_ROW_UNIT,
    FourierFeatures,
)
from dpcore.mechanisms.noise import MAX_SLACK, LatticePlan, lattice_plan
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import PublicFacts

N, D, DELTA, EPSILON = 10_000, 784, 1e-5, 1.0
# What the accountants' analyses are stated for (module docstring), written out here rather
# than read from the mechanisms: a contribution of norm ≤ 1, a k-means row moved by ≤ 1.
CONTRIBUTION = 1.0
ROW_MOVE = 1.0
# σ_true equals σ·(1 + 10⁻¹²) in exact arithmetic; the PLD's ε jitters by ~10⁻¹¹ with z.
TOLERANCE = 1 + 1e-9


def _calibrated(mechanism: str, params: dict[str, Any], classes: int) -> Any:
    spec = registry.get(mechanism)
    validated = spec.params.model_validate(params)
    facts = PublicFacts(n=N, n_features=D, n_classes=classes)
    accountant = spec.accountant("tight")
    keys = spec.accountant_keys(accountant, validated, facts)
    return accountant.calibrate(EPSILON, DELTA, keys)


@functools.cache
def _vae_parameters() -> int:
    shapes = VAE(D, 200, 2).init(1, lambda shape: torch.zeros(shape))
    return sum(v.numel() for v in shapes.values())


def _old_plan(plan: LatticePlan) -> LatticePlan:
    """The Δ-relative cover at the coarsest lattice the planner allows (slack 2⁻⁶ of Δ)."""
    g = 2.0 ** math.floor(math.log2(MAX_SLACK * plan.sensitivity / math.sqrt(plan.dim)))
    raised = plan.sigma * (1 + (plan.error + g * math.sqrt(plan.dim)) / plan.sensitivity)
    return LatticePlan(plan.sigma, plan.sensitivity, plan.dim, g, raised, plan.error)


def _coarse(plan: LatticePlan) -> LatticePlan:
    """The planner's cover (relative to its unit) at that coarsest lattice: the cover must
    hold whatever the lattice."""
    g = 2.0 ** math.floor(math.log2(MAX_SLACK * plan.sensitivity / math.sqrt(plan.dim)))
    raised = plan.sigma * (1 + (plan.error + g * math.sqrt(plan.dim)) / plan.cover_unit)
    return LatticePlan(
        plan.sigma, plan.sensitivity, plan.dim, g, raised, plan.error, plan.cover_unit
    )


def _true_sigma(plan: LatticePlan, unit: float) -> float:
    """σ_true = σ'·u/(u + b): every analysed distance a ≥ u, rounded, is at most a·σ'/σ_true."""
    moved = plan.error + plan.lattice * math.sqrt(plan.dim)
    return plan.sigma_effective * unit / (unit + moved)


def _gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ (Dong, Roth, Su 2022, Cor. 2.13), solved here."""

    def gap(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(gap, 0.0, 100.0, xtol=1e-12)


def _pld_epsilon(mu_gaussian: float, q: float, z: float, steps: int) -> float:
    """A replace-one Gaussian of shift μ composed with ``steps`` Poisson-subsampled Gaussians
    of multiplier z (contribution 1), in dp_accounting's PLD accountant."""
    accountant = dpa.pld.PLDAccountant(
        dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4
    )
    events: list[dpa.DpEvent] = []
    if mu_gaussian > 0:
        events.append(dpa.GaussianDpEvent(2.0 / mu_gaussian))
    step = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z))
    events.append(dpa.SelfComposedDpEvent(step, steps))
    accountant.compose(dpa.ComposedDpEvent(events))
    return float(accountant.get_epsilon(DELTA))


def _fourier_error(frequencies: int) -> float:
    fourier = FourierFeatures.draw(D, frequencies, 0.5, SecureRandom.from_seed(0))
    return fourier.sum_error(float_error.stored_rows(1.0), terms=N)


def _dpgm_plans(event: Any, networks: int, kmeans: bool) -> dict[str, LatticePlan]:
    noise = event.noise()
    sigma = {s.name: s.sigma for s in noise.scales}
    plans = {
        "gradients": lattice_plan(
            sigma=sigma["gradients"],
            sensitivity=dpsgd.GRADIENT_SENSITIVITY,
            dim=networks * _vae_parameters(),
            error=dpsgd.rounding_error(N),
            unit=dpsgd.GRADIENT_RADIUS,
        ),
        "histogram": lattice_plan(
            sigma=sigma["norm_histogram"],
            sensitivity=dpsgd.HISTOGRAM_SENSITIVITY,
            dim=registry.get("dpgm").params.model_validate({}).norm_bins,
            unit=dpsgd.HISTOGRAM_RADIUS,
        ),
        "counts": lattice_plan(sigma=sigma["kmeans"], sensitivity=COUNT_SENSITIVITY, dim=1),
    }
    if kmeans:
        plans["kmeans_sums"] = lattice_plan(
            sigma=sigma["kmeans"],
            sensitivity=FOURIER_SUM_SENSITIVITY,
            dim=2 * 200,
            error=_fourier_error(200),
            unit=SUM_ROW_UNIT,
        )
    return plans


def _dpgm_true_epsilon(event: Any, plans: dict[str, LatticePlan]) -> float:
    gradients = _true_sigma(plans["gradients"], CONTRIBUTION)
    histogram = _true_sigma(plans["histogram"], CONTRIBUTION)
    counts = _true_sigma(plans["counts"], ROW_MOVE)
    mu2 = 2.0 / counts**2 if event.final_counts else 0.0
    if "kmeans_sums" in plans:
        sums = _true_sigma(plans["kmeans_sums"], ROW_MOVE)
        # A record moved: two rows by ≤ 1 and two counts by 1; replaced in its cluster: one
        # row by ≤ 2 (Fourier features take both signs).
        per_step = max(4.0 / sums**2, 2.0 / sums**2 + 2.0 / counts**2)
        mu2 += event.kmeans_iterations * per_step
    z = 1.0 / math.sqrt(1.0 / histogram**2 + 1.0 / gradients**2)
    return _pld_epsilon(math.sqrt(mu2), event.q, z, event.sgd_steps)


@pytest.mark.parametrize(("networks", "clusters"), [(1, 1), (2, 1), (3, 1), (10, 1), (3, 3)])
def test_dpgm_rounding_keeps_the_reported_epsilon(networks: int, clusters: int) -> None:
    """One network per class (1, 2, 3, 10 classes), and 3 clusters of one class found by the
    Fourier-feature kernel k-means."""
    classes = networks // clusters
    event = _calibrated("dpgm", {"clusters_per_class": clusters}, classes)
    reported = event.epsilon(DELTA)
    assert reported <= EPSILON
    plans = _dpgm_plans(event, networks, kmeans=clusters > 1)
    assert _dpgm_true_epsilon(event, plans) <= reported * TOLERANCE
    # At the coarsest lattice, the unit-relative cover still holds and the Δ-relative fails.
    coarse = {k: _coarse(p) for k, p in plans.items()}
    assert _dpgm_true_epsilon(event, coarse) <= reported * TOLERANCE
    old = {k: _old_plan(p) for k, p in plans.items()}
    assert _dpgm_true_epsilon(event, old) > reported * 1.001


def test_dpkip_rounding_keeps_the_reported_epsilon() -> None:
    """ClustMix ``dp`` with DP-KIP (k-means on the records, whose rows are covered relative
    to their smaller move already): the KIP steps' sums of clipped gradients over all centres
    (10 classes × 4 clusters × 784 coordinates at most)."""
    params = {"variant": "dp", "clusters_per_class": 4, "dpkip_steps": 200}
    event = _calibrated("clustmix", params, 10)
    reported = event.epsilon(DELTA)
    assert reported <= EPSILON
    kip = lattice_plan(
        sigma=event.kip_noise_multiplier,
        sensitivity=dpkip.SENSITIVITY,
        dim=40 * D,
        error=float_error.scaled_sum(dpkip.SENSITIVITY, terms=N, magnitude=float(N)),
        unit=dpkip.RADIUS,
    )
    # The k-means and final Gaussians (records: unit = Δ = 1 per row): their μ, scaled by
    # the largest σ/σ_true of their plans (μ is homogeneous of degree −1 in the σ's).
    gaussian = event.gaussian
    ratio = 1.0
    for name, sigma in gaussian.scales().items():
        sensitivity = SUM_ROW_SENSITIVITY if "sums" in name else COUNT_SENSITIVITY
        dim = D if "sums" in name else 1
        plan = lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=1e-6)
        ratio = max(ratio, sigma / _true_sigma(plan, sensitivity))

    def true(plan: LatticePlan) -> float:
        z = _true_sigma(plan, CONTRIBUTION)
        return _pld_epsilon(gaussian.mu * ratio, event.q, z, event.kip_steps)

    assert true(kip) <= reported * TOLERANCE
    assert true(_coarse(kip)) <= reported * TOLERANCE
    # The charged (proven) pair is looser than dp_accounting's antipodal one, and that slack
    # absorbs the old cover's loss in ε here; the loss itself shows in the noise the rounded
    # sums see, below the σ the accountant was given (every accountant is monotone in it).
    charged = event.kip_noise_multiplier
    assert _true_sigma(kip, CONTRIBUTION) >= charged / TOLERANCE
    assert _true_sigma(_coarse(kip), CONTRIBUTION) >= charged / TOLERANCE
    assert _true_sigma(_old_plan(kip), CONTRIBUTION) < charged * (1 - 1e-3)


def test_fourier_kmeans_rounding_keeps_each_steps_mu() -> None:
    """ClustMix ``dp`` on Fourier features: every k-means step's μ² at the noise the rounded
    rows see is at most the 4/σ² charged (it was 4.04–4.06 with the Δ-relative cover)."""
    params = {"variant": "dp", "clusters_per_class": 4, "feature_map": "rff"}
    event = _calibrated("clustmix", params, 10)
    scales = event.scales()
    sigma = scales["kmeans_sums"]
    assert scales["kmeans_counts"] == sigma
    charged = 4.0 / sigma**2
    sums = lattice_plan(
        sigma=sigma,
        sensitivity=FOURIER_SUM_SENSITIVITY,
        dim=2 * params_frequencies(),
        error=_fourier_error(params_frequencies()),
        unit=SUM_ROW_UNIT,
    )
    counts = lattice_plan(sigma=sigma, sensitivity=COUNT_SENSITIVITY, dim=1)

    def mu2(sums: LatticePlan) -> float:
        s, c = _true_sigma(sums, ROW_MOVE), _true_sigma(counts, ROW_MOVE)
        return max(4.0 / s**2, 2.0 / s**2 + 2.0 / c**2)

    assert mu2(sums) <= charged * TOLERANCE
    assert mu2(_coarse(sums)) <= charged * TOLERANCE
    assert mu2(_old_plan(sums)) > charged * 1.001
    # And the release's ε at the true μ (final step and k-means together) stays reported.
    reported = event.epsilon(DELTA)
    final_sums = lattice_plan(sigma=scales["sums"], sensitivity=SUM_ROW_SENSITIVITY, dim=D)
    final_counts = lattice_plan(sigma=scales["counts"], sensitivity=COUNT_SENSITIVITY, dim=1)
    final = 2.0 / _true_sigma(final_sums, 1.0) ** 2 + 2.0 / _true_sigma(final_counts, 1.0) ** 2
    true_mu = math.sqrt(final + event.kmeans_steps * mu2(sums))
    assert _gdp_epsilon(true_mu, DELTA) <= reported * TOLERANCE


def params_frequencies() -> int:
    return registry.get("clustmix").params.model_validate({}).rff_frequencies


class _Recording:
    """A sampler that adds nothing and keeps each call's keyword arguments."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append({"dim": int(values.shape[-1]), **kwargs})
        return values


def test_the_mechanisms_pass_the_units_the_analyses_are_stated_for() -> None:
    """The plans above assume these calls: DP-SGD's gradient and histogram, DP-KIP's sum and
    the Fourier k-means sums pass their unit (1) with their replace-one sensitivity."""
    torch.manual_seed(0)
    net = VAE(d=5, hidden=4, latent=2)
    params = net.init(2, lambda shape: torch.randn(shape))
    recording = _Recording()
    settings = dpsgd.SGDSettings(
        steps=1, batch=3, sigma=1.0, sigma_norm=2.0, clip_max=1.0, bins=4, lr=1e-3
    )
    dpsgd.noisy_step(
        net,
        params,
        torch.rand((6, 5)),
        torch.tensor([0, 1, 0, 1, 0, 1]),
        torch.arange(6),
        settings,
        sampler=recording,
        normal=lambda shape: torch.randn(shape),
        error=1e-9,
    )
    histogram, gradients = recording.calls
    assert (histogram["sensitivity"], histogram["unit"]) == (
        dpsgd.HISTOGRAM_SENSITIVITY,
        CONTRIBUTION,
    )
    assert (gradients["sensitivity"], gradients["unit"]) == (2.0, CONTRIBUTION)
    assert gradients["dim"] == 2 * sum(v[0].numel() for v in params.values())

    recording = _Recording()
    Z = torch.rand((12, 3), dtype=torch.float64)
    Z = Z / Z.norm(dim=1, keepdim=True)
    groups = torch.tensor([0, 1] * 6)
    settings_kip = dpkip.KIPSettings(
        steps=1, batch=6, clip=1.0, lr=0.01, ridge=1e-3, width=0.5, noise_multiplier=3.0
    )
    dpkip.adapt(
        Z,
        groups,
        2,
        Z[:4].clone(),
        torch.tensor([0, 1, 0, 1]),
        settings_kip,
        sampler=recording,
        generator=SecureRandom.from_seed(1),
    )
    (kip,) = recording.calls
    assert (kip["sensitivity"], kip["unit"], kip["dim"]) == (2.0, CONTRIBUTION, 12)

    from dpcore.mechanisms.kmeans import Centres, assign, noisy_statistics

    recording = _Recording()
    phi = FourierFeatures.draw(3, 8, 0.5, SecureRandom.from_seed(2))
    centres = Centres(torch.zeros((2, 16), dtype=torch.float64), torch.tensor([0, 1]))
    noisy_statistics(
        Z,
        assign(Z, groups, centres, chunk=4, features=phi),
        2,
        sigma_sums=2.0,
        sigma_counts=2.0,
        sampler=recording,
        error=1e-9,
        features=phi,
    )
    sums, counts = recording.calls
    assert (sums["sensitivity"], sums["unit"], sums["dim"]) == (2.0, ROW_MOVE, 16)
    assert counts["sensitivity"] == ROW_MOVE and counts.get("unit") in (None, ROW_MOVE)
