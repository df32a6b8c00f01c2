"""ClustMix dp with DP-KIP: the closed-form per-record gradients against autograd, the Poisson
sampler the accountant assumes, the noise it declares, and the accountant's composition."""

from __future__ import annotations

import math
import warnings
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch

from dpcore.accounting import dpsgd
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix import dpkip
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent, ClustMixDPKIPEvent
from dpcore.mechanisms.run import facts_of
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams
from tests.unit.test_acc_dpgm import _ProvenPairPRV
from tests.unit.test_clustmix_dp import _release, _toy

pytestmark = pytest.mark.unit

TIGHT = registry.accountant("clustmix", "tight")
KEYS = {
    "clusters_per_class": 8,
    "kmeans_refine": 1,
    "kmeans_share": 0.5,
    "count_share": 0.1,
    "dpkip_steps": 40,
    "dpkip_batch": 100,
    "dpkip_share": 0.2,
    "n": 10000,
}


def test_per_record_gradients_match_autograd() -> None:
    rng = np.random.default_rng(0)
    m, k, c, b = 7, 5, 3, 4
    support = torch.as_tensor(rng.uniform(0, 0.5, (m, k)))
    labels = torch.eye(c, dtype=torch.float64)[rng.integers(0, c, m)]
    x = torch.as_tensor(rng.uniform(0, 0.5, (b, k)))
    y = torch.eye(c, dtype=torch.float64)[rng.integers(0, c, b)]
    grads = dpkip.per_record_gradients(support, labels, x, y, ridge=0.01, width=0.4)
    for i in range(b):
        s = support.clone().requires_grad_(True)
        K = dpkip.rbf(s, s, 0.4) + 0.01 * torch.eye(m, dtype=torch.float64)
        A = torch.linalg.solve(K, labels)
        loss = ((dpkip.rbf(x[i : i + 1], s, 0.4) @ A - y[i]) ** 2).sum()
        (expected,) = torch.autograd.grad(loss, s)
        assert torch.allclose(grads[i], expected, rtol=1e-9, atol=1e-12)


def test_the_event_is_the_pld_composition_of_both_parts() -> None:
    event = TIGHT.at_sigma(2.0, KEYS)
    assert isinstance(event, ClustMixDPKIPEvent) and event.q == 100 / 10000
    gaussian = TIGHT.at_sigma(2.0, {**KEYS, "dpkip_steps": 0})
    assert isinstance(gaussian, ClustMixDPEvent) and event.gaussian == gaussian
    # Each DP-KIP step is charged as the proven two-term replace-one pair (presence 1/z,
    # replacement 2/z; ``dpcore.accounting.dpsgd``) composed with the Gaussian part at its
    # exact μ; an independent accountant (prv_accountant) of the simpler proven pair (P*, Q*)
    # of distance 2/z bounds it from above.
    z = event.kip_noise_multiplier
    assert event.kip_distance == pytest.approx(2 / z, rel=1e-15)
    ours = event.epsilon(1e-5)
    assert ours == dpsgd.epsilon(
        sampling_prob=event.sampling_prob,
        present=1 / z,
        replaced=2 / z,
        steps=40,
        delta=1e-5,
        gaussian_mu=gaussian.mu,
    )
    prv_accountant = pytest.importorskip("prv_accountant")
    from prv_accountant.privacy_random_variables import GaussianMechanism, PrivacyRandomVariable

    class ProvenPRV(_ProvenPairPRV, PrivacyRandomVariable):
        pass

    prvs = [ProvenPRV(0.01, 2 / z), GaussianMechanism(noise_multiplier=1 / gaussian.mu)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = prv_accountant.PRVAccountant(
            prvs=prvs, max_self_compositions=[40, 1], eps_error=0.02, delta_error=1e-9
        )
        _, _, high = prv.compute_epsilon(delta=1e-5, num_self_compositions=[40, 1])
    assert ours <= high
    # Above what the steps realise: two records whose clipped gradients are antipodal at full
    # norm (dp_accounting's REPLACE_ONE pair at z; pessimistic PLD, so compared with 1e-3
    # slack) — the pair charged before the proven one, whose domination was only checked
    # numerically.
    accountant = dpa.pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.GaussianDpEvent(2.0 / gaussian.mu))
    accountant.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z)), 40)
    assert ours >= accountant.get_epsilon(1e-5) * (1 - 1e-3)
    assert gaussian.epsilon(1e-5) < ours
    # The split heuristic: the KIP part's CLT μ² is the share asked for.
    mu_kip2 = 0.01**2 * 40 * math.expm1(4 / z**2)
    assert mu_kip2 / (mu_kip2 + gaussian.mu**2) == pytest.approx(0.2)
    declared = {n.name: (n.sigma, n.sensitivity) for n in event.noise().scales}
    assert declared["kip"] == (z, 2.0)


@pytest.mark.parametrize("target", [1.0, 10.0])
def test_calibration_with_dpkip_never_overshoots(target: float) -> None:
    event = TIGHT.calibrate(target, 1e-5, KEYS)
    assert event.epsilon(1e-5) <= target
    assert TIGHT.at_sigma(event.sigma * (1 - 1e-4), KEYS).epsilon(1e-5) > target


def test_no_dpkip_without_k_means_or_n() -> None:
    # One cluster per class: no k-means steps, nothing to adapt, nothing charged for it.
    assert isinstance(TIGHT.at_sigma(2.0, {**KEYS, "clusters_per_class": 1}), ClustMixDPEvent)
    with pytest.raises(ValueError, match="needs n"):
        TIGHT.at_sigma(2.0, {k: v for k, v in KEYS.items() if k != "n"})


class _Counting(SecureRandom):
    """The release's secure source, recording every Bernoulli draw it is asked for."""

    def __init__(self) -> None:
        super().__init__(key=bytes(32))
        self.draws: list[tuple[int, int, tuple[int, ...]]] = []

    def bernoulli(self, numerator: int, denominator: int, shape: tuple[int, ...]) -> np.ndarray:
        self.draws.append((numerator, denominator, shape))
        return super().bernoulli(numerator, denominator, shape)


def test_release_samples_poisson_batches_at_the_accountants_rate(monkeypatch: Any) -> None:
    source = _Counting()
    monkeypatch.setattr("tests.unit.test_clustmix_dp.SecureRandom.from_seed", lambda _: source)
    params = {"clusters_per_class": 2, "dpkip_steps": 3, "dpkip_batch": 30}
    out, recorder = _release(params, sigma=0.5)
    n = 240  # _toy's records
    assert source.draws == [(30, n, (n,))] * 3
    keys = {**KEYS, **params, "n": n}
    scales = TIGHT.at_sigma(0.5, keys).scales()
    kip = [shape for sigma, shape in recorder.calls if sigma == pytest.approx(scales["kip"])]
    # One noisy gradient per step, the whole support set as one row (its sensitivity is 2C).
    assert len(kip) == 3 and all(shape[0] == 1 for shape in kip)
    assert out.rows >= 1


def test_admission_refuses_dpkip_it_cannot_run() -> None:
    spec = registry.get("clustmix")
    facts = facts_of(_toy())
    cases = [
        ({"dpkip_steps": 5, "feature_map": "rff"}, "needs feature_map none"),
        ({"dpkip_steps": 5, "clusters_per_class": 1}, "needs clusters_per_class > 1"),
        ({"dpkip_steps": 5, "dpkip_batch": 241}, "exceeds the dataset's 240 records"),
    ]
    for body, message in cases:
        with pytest.raises(InvalidParams, match=message):
            spec.check(spec.params.model_validate(body), facts)


@pytest.mark.parametrize(
    "body",
    [
        {"dpkip_steps": 5, "dpkip_batch": 16},
        {"dpkip_steps": 5, "dpkip_batch": 16, "feature_map": "rff"},
        {"dpkip_steps": 5, "dpkip_batch": 16, "clusters_per_class": 1},
        {"feature_map": "rff"},
        {"clusters_per_class": 1, "dpkip_steps": 0},
    ],
)
def test_the_schema_states_the_dpkip_rules(body: dict[str, Any]) -> None:
    """A body valid by the published JSON schema passes the spec's check (on a dataset large
    enough for the batch), and a body the check refuses is invalid by the schema."""
    import jsonschema

    spec = registry.get("clustmix")
    by_schema = jsonschema.Draft202012Validator(spec.params.model_json_schema()).is_valid(body)
    try:
        spec.check(spec.params.model_validate(body), facts_of(_toy()))
        accepted = True
    except InvalidParams:
        accepted = False
    assert by_schema == accepted
