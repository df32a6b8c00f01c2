"""DP-CDA with ``class_sizes: "dp"``: noisy counts, DP lower bounds, the composed accounting
(``dpcore.mechanisms.dpcda.accounting_counts``) and the release path; ``declared`` states its
neighbour restriction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pldm
from scipy import special

from dpcore.accounting import pld
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpcda.accounting import DPCDAEvent
from dpcore.mechanisms.dpcda.accounting_counts import DPCountsMixing, lower_bounds
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams
from service.datasets.parsing import ParsedDataset

TIGHT = registry.accountant("dpcda", "tight")
DELTA = 1e-5
MNIST = {
    "n": 10_000,
    "mixture_degree": 64,
    "n_samples": 10_000,
    "clip_norm": 1.0,
    "n_classes": 10,
    "min_class_size": 750,
    "class_sizes": "declared",
}
DP = {**MNIST, "class_sizes": "dp", "count_noise": 20.0}


def test_lower_bounds_fail_with_probability_at_most_beta() -> None:
    """Union bound over K Gaussian tails: each bound exceeds its count with probability
    β/K exactly, so some bound does with probability ≤ β (here ≈ β: tails rarely overlap)."""
    rng = np.random.default_rng(0)
    counts = np.array([50, 80, 120, 400])
    sigma, beta, trials = 3.0, 0.05, 200_000
    noisy = counts + rng.normal(0, sigma, size=(trials, 4))
    bounds = np.stack([lower_bounds(row, sigma, beta) for row in noisy[:20_000]])
    wrong_any = (bounds > counts).any(axis=1).mean()
    assert wrong_any <= beta  # the floor to integers only lowers it
    # Per class: P(Y − σ·z > N) = β/K (the floor only lowers it).
    margin = sigma * -special.ndtri(beta / 4)
    assert ((noisy - margin) > counts).mean(axis=0) == pytest.approx([beta / 4] * 4, rel=0.1)


def test_dp_event_composes_counts_and_mixing_by_pld() -> None:
    """ε at δ is the PLD of G(μ_c) ⊗ ω*^{2T_c} read at δ − (1 + e^ε̄)β, where the Gaussian
    here is dp_accounting's own (not the shared WOR pair at p = 1)."""
    event = TIGHT.at_sigma(0.3, DP)
    assert isinstance(event, DPCountsMixing)
    mix = event.mixing
    assert isinstance(mix, DPCDAEvent) and mix.nonnegative
    p, z, T = mix.sampling_prob, mix.noise_multiplier, 2 * mix.mixtures_per_class
    h = pld.default_interval(p, z, pld.tail_level(DELTA, T))
    gauss = pldm.from_gaussian_mechanism(
        20.0 / math.sqrt(2), value_discretization_interval=h, use_connect_dots=True
    )
    composed = pld.compose(pld.mixture_pmf(p, z, h, pld.tail_level(DELTA, T)), T).compose(gauss)
    cap = composed.get_epsilon_for_delta(DELTA / 2)
    expected = composed.get_epsilon_for_delta(DELTA - (1 + math.exp(cap)) * 1e-9)
    assert event.epsilon(DELTA) == pytest.approx(expected, rel=1e-6)
    # Costs more than declared class sizes at the same σ (counts, 2T_c steps of ω*, β) …
    declared = TIGHT.at_sigma(0.3, MNIST)
    assert event.epsilon(DELTA) > declared.epsilon(DELTA)
    # … and the cost carries no Rényi curve (β is an additive δ no curve holds).
    cost = event.cost(DELTA)
    assert cost.rdp is None and cost.epsilon == event.epsilon(DELTA)
    assert [s.name for s in event.noise().scales] == ["counts", "features"]
    assert event.noise().scale("counts").sensitivity == pytest.approx(math.sqrt(2))
    assert event.noise().analysis["class_size_failure_prob"] == 1e-9


def test_beta_and_count_noise_move_epsilon_the_right_way() -> None:
    base = TIGHT.at_sigma(0.3, DP).epsilon(DELTA)
    assert TIGHT.at_sigma(0.3, {**DP, "count_noise": 10.0}).epsilon(DELTA) > base
    big_beta = TIGHT.at_sigma(0.3, {**DP, "class_size_failure_prob": 1e-6}).epsilon(DELTA)
    assert big_beta > base
    # β too large for δ: no finite ε by this argument.
    assert TIGHT.at_sigma(0.3, {**DP, "class_size_failure_prob": 1e-3}).epsilon(DELTA) == math.inf


def test_dp_statistics_fold_into_the_gaussian() -> None:
    keys = {**DP, "standardization": "dp", "stats_noise": 60.0, "d_x": 8}
    event = TIGHT.at_sigma(0.3, keys)
    assert isinstance(event, DPCountsMixing)
    assert event.gaussian_mu == pytest.approx(math.hypot(math.sqrt(2) / 20, 4 / 60))
    assert [s.name for s in event.noise().scales] == ["statistics", "counts", "features"]
    assert event.noise().scale("statistics").sensitivity == pytest.approx(4.0)
    assert event.epsilon(DELTA) > TIGHT.at_sigma(0.3, DP).epsilon(DELTA)


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_calibration_never_overshoots(target: float) -> None:
    event = TIGHT.calibrate(target, DELTA, DP)
    assert event.epsilon(DELTA) <= target
    assert TIGHT.at_sigma(event.sigma * (1 - 1e-5), DP).epsilon(DELTA) > target  # type: ignore[attr-defined]


def test_key_rules() -> None:
    # 'dp' is the default; without count_noise the parameters' rule fills it in from public
    # keys (m/(4·Φ⁻¹(1 − β/K))), the same value admission stores.
    undeclared = {k: v for k, v in MNIST.items() if k != "class_sizes"}
    event = TIGHT.at_sigma(0.3, undeclared)
    assert isinstance(event, DPCountsMixing)
    z = -special.ndtri(1e-9 / 10)
    assert event.count_noise == pytest.approx(750 / (4 * z), rel=1e-9)
    assert TIGHT.at_sigma(0.3, {**undeclared, "class_sizes": "dp"}) == event
    with pytest.raises(ValueError, match="count_noise"):
        TIGHT.at_sigma(0.3, {**MNIST, "count_noise": 3.0})
    with pytest.raises(ValueError, match="declared"):
        registry.accountant("dpcda", "paper").at_sigma(0.3, DP)


# --- the release path ----------------------------------------------------------------------------


def _data(counts: list[int], d: int = 4) -> ParsedDataset:
    rng = np.random.default_rng(3)
    labels = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
    X = rng.uniform(0, 1, size=(labels.size, d))
    return ParsedDataset(
        X=X,
        feature_shape=(d,),
        feature_names=[f"f{i}" for i in range(d)],
        labels=labels,
        classes=list(range(len(counts))),
        classes_declared=True,
        lo=np.zeros(d),
        hi=np.ones(d),
        clipped_values=0,
    )


def _release(counts: list[int], params: dict):  # type: ignore[no-untyped-def, type-arg]
    data = _data(counts)
    spec = registry.get("dpcda")
    spec.check(spec.params(**params), facts_of(data))
    noise = noise_for("dpcda", params, facts_of(data), sigma=0.5)
    generator = SecureRandom.from_seed(0)
    out = build(
        "dpcda",
        params,
        data,
        noise=noise,
        sampler=FastNoise(generator),
        generator=generator,
        device=torch.device("cpu"),
    )
    X = torch.cat([x for x, _ in out.chunks]).numpy()
    return out, X


PARAMS = {"mixture_degree": 4, "n_samples": 3000, "class_sizes": "dp", "count_noise": 0.5}


def test_dp_release_mixes_when_the_bounds_reach_the_floor() -> None:
    out, X = _release([60, 80], {**PARAMS, "min_class_size": 40})
    meta = out.preprocessing
    assert meta["mixed"] is True
    assert len(meta["dp_class_counts"]) == 2 and all(
        b <= c for b, c in zip(meta["dp_class_size_lower_bounds"], [60, 80], strict=True)
    )
    assert X.shape == (3000, 4)
    assert X.mean() > 0.3  # means of records in [0, 1] (scaled to norm ≤ 1), plus noise


def test_dp_release_replaces_mixtures_by_noise_below_the_floor() -> None:
    """A floor above a class's size is not refused at admission (no private count is read)
    and the job publishes noise alone: no record enters the output."""
    out, X = _release([60, 45], {**PARAMS, "min_class_size": 50})
    assert out.preprocessing["mixed"] is False
    assert X.shape == (3000, 4)
    assert abs(X.mean()) < 0.05 and abs(X.std() - 0.5) < 0.05


def test_declared_refuses_on_private_counts_and_states_its_restriction() -> None:
    declared = {"mixture_degree": 4, "n_samples": 30, "class_sizes": "declared"}
    with pytest.raises(InvalidParams, match="min_class_size"):
        _release([60, 30], {**declared, "min_class_size": 50})
    out, _ = _release([60, 30], {**declared, "min_class_size": 30})
    assert "at least 30 records" in out.preprocessing["class_sizes"]
    assert "both neighbours" in out.preprocessing["class_sizes"]


# --- the defaults (class sizes 'dp' is the default) ----------------------------------------------


def test_default_failure_prob_follows_the_target_so_high_epsilon_is_reachable() -> None:
    """With β fixed at 1e-9, (1 + e^ε)·β ≤ δ/2 caps ε at ln(δ/2β) − … ≈ 8.5 at δ = 1e-5: a
    request for ε = 10 would be calibrated to 8.5 (more noise than needed). Left out, β is
    chosen for the target, and the event's analysis carries it (admission stores it)."""
    undeclared = {k: v for k, v in MNIST.items() if k != "class_sizes"}
    fixed = TIGHT.calibrate(10.0, DELTA, {**undeclared, "class_size_failure_prob": 1e-9})
    assert fixed.epsilon(DELTA) < 8.6  # the cap
    event = TIGHT.calibrate(10.0, DELTA, undeclared)
    assert isinstance(event, DPCountsMixing)
    beta = 1e-3 * DELTA / (1 + math.exp(10.0))
    assert event.failure_prob == pytest.approx(beta, rel=1e-12)
    assert event.noise().analysis["class_size_failure_prob"] == event.failure_prob
    assert 9.9 < event.epsilon(DELTA) <= 10.0
    assert event.sigma < fixed.sigma  # type: ignore[attr-defined]
    # At small ε the reference 1e-9 is already below the rule's bound.
    assert TIGHT.calibrate(1.0, DELTA, undeclared).failure_prob == 1e-9  # type: ignore[attr-defined]
    # At a given σ (no target) the reference.
    assert TIGHT.at_sigma(0.3, undeclared).failure_prob == 1e-9  # type: ignore[attr-defined]


def test_a_target_the_counts_alone_exceed_is_refused_with_the_reason() -> None:
    # breast-cancer's shape: n = 398, K = 2, m = 99 → count_noise 4.05, μ_c = 0.35.
    keys = {"n": 398, "mixture_degree": 12, "n_samples": 398, "clip_norm": 1.0, "n_classes": 2}
    keys["min_class_size"] = 99
    with pytest.raises(ValueError, match=r"alone cost ε 1\.3"):
        TIGHT.calibrate(1.0, DELTA, keys)
    assert TIGHT.calibrate(4.0, DELTA, keys).epsilon(DELTA) <= 4.0
    # A larger count_noise, or the opt-in declared class sizes, meet ε = 1.
    assert TIGHT.calibrate(1.0, DELTA, {**keys, "count_noise": 40.0}).epsilon(DELTA) <= 1.0
    assert TIGHT.calibrate(1.0, DELTA, {**keys, "class_sizes": "declared"}).epsilon(DELTA) <= 1


def test_the_request_schema_states_the_defaults_and_the_relation() -> None:
    spec = registry.get("dpcda")
    schema = spec.request_params.model_json_schema()
    props = schema["properties"]
    assert props["class_sizes"]["default"] == "dp"
    assert "narrower neighbour" in props["class_sizes"]["description"]
    assert "Default: class_sizes dp: min_class_size / (4·Φ⁻¹" in props["count_noise"]["description"]
    # Declared statistics are published verbatim: said where they are declared.
    for name in ("feature_mean", "feature_std"):
        assert "published verbatim" in props[name]["description"]
        assert "uncharged statistic" in props[name]["description"]
    # The schema's rules take a 'dp' request without count_noise (filled in at admission)
    # and refuse count_noise with 'declared'.
    import jsonschema

    jsonschema.validate({"mixture_degree": 4, "n_samples": 8}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"mixture_degree": 4, "n_samples": 8, "class_sizes": "declared", "count_noise": 1.0},
            schema,
        )
    # The relation: replace-one unless declared; stored parameters without class_sizes
    # predate 'dp' and were declared.
    assert spec.neighbours({"class_sizes": "dp", "min_class_size": 40}) == "replace-one (n public)"
    declared = spec.neighbours({"class_sizes": "declared", "min_class_size": 40})
    assert "every class has at least 40 records" in declared
    assert spec.neighbours({"min_class_size": 40}) == declared
    assert registry.get("dpmix").neighbours({}) == "replace-one (n public)"
