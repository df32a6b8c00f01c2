"""DP-CDA with ``class_sizes: "dp"``: noisy counts, DP lower bounds, the composed accounting
(``dpcore.mechanisms.dpcda.accounting_counts``) and the release path; ``declared`` states its
neighbour restriction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pldm
from scipy import special

from dpcore.accounting import gdp, pld
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpcda.accounting import DPCDAEvent
from dpcore.mechanisms.dpcda.accounting_counts import DPCountsMixing, lower_bounds
from dpcore.mechanisms.dpcda.params import (
    COUNT_NOISE_RULE,
    COUNTS_MU2_SHARE,
    count_noise_for_target,
    default_count_noise,
)
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams, PublicFacts
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
    assert "below min_class_size 50" in out.preprocessing["not_mixed"]
    assert X.shape == (3000, 4)
    assert abs(X.mean()) < 0.05 and abs(X.std() - 0.5) < 0.05


def test_default_release_at_a_small_target_succeeds_and_says_it_did_not_mix() -> None:
    """Admission's plan (count_noise chosen for ε = 1) then the job on its stored parameters
    and noise: the larger count noise puts the bounds below m = 40 on classes of 60 and 80,
    and the release succeeds with noise alone, saying why in its metadata."""
    data = _data([60, 80])
    spec = registry.get("dpcda")
    facts = facts_of(data)
    request = spec.request_params.model_validate({"min_class_size": 40, "mixture_degree": 4})
    planned = spec.plan(request, facts, Target("tight", epsilon=1.0, delta=1e-5))
    stored = planned.stored_params()
    assert stored["count_noise"] == count_noise_for_target(40, 2, 1.0, 1e-5)
    generator = SecureRandom.from_seed(0)
    out = build(
        "dpcda",
        stored,
        data,
        noise=planned.noise,
        sampler=FastNoise(generator),
        generator=generator,
        device=torch.device("cpu"),
    )
    X = torch.cat([x for x, _ in out.chunks]).numpy()
    meta = out.preprocessing
    assert meta["mixed"] is False
    assert meta["count_noise"] == stored["count_noise"]
    assert max(meta["dp_class_size_lower_bounds"]) < 40
    assert "below min_class_size 40" in meta["not_mixed"]
    assert "noise alone" in meta["not_mixed"]
    assert X.shape == (stored["n_samples"], 4)


def test_the_job_refuses_a_count_noise_other_than_the_charged_one() -> None:
    data = _data([60, 80])
    params = {**PARAMS, "min_class_size": 40}
    noise = noise_for("dpcda", {**params, "count_noise": 2.0}, facts_of(data), sigma=0.5)
    generator = SecureRandom.from_seed(0)
    with pytest.raises(ValueError, match="charged counts' noise"):
        build(
            "dpcda",
            params,
            data,
            noise=noise,
            sampler=FastNoise(generator),
            generator=generator,
            device=torch.device("cpu"),
        )


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


def test_an_explicit_count_noise_the_target_cannot_afford_is_refused_with_the_reason() -> None:
    # breast-cancer's shape: n = 398, K = 2, m = 99; count_noise 4.05 (the public rule's value
    # there), μ_c = 0.35: the counts alone cost more than ε = 1.
    keys = {"n": 398, "mixture_degree": 12, "n_samples": 398, "clip_norm": 1.0, "n_classes": 2}
    keys["min_class_size"] = 99
    public = default_count_noise(99, 2)
    assert public == pytest.approx(4.05, abs=0.01)
    with pytest.raises(ValueError, match=r"count_noise 4\.05.*alone cost ε 1\.3"):
        TIGHT.calibrate(1.0, DELTA, {**keys, "count_noise": public})
    assert TIGHT.calibrate(4.0, DELTA, {**keys, "count_noise": public}).epsilon(DELTA) <= 4.0
    # A larger count_noise, the default (chosen for the target) or the opt-in declared class
    # sizes meet ε = 1.
    assert TIGHT.calibrate(1.0, DELTA, {**keys, "count_noise": 40.0}).epsilon(DELTA) <= 1.0
    assert TIGHT.calibrate(1.0, DELTA, keys).epsilon(DELTA) <= 1.0
    assert TIGHT.calibrate(1.0, DELTA, {**keys, "class_sizes": "declared"}).epsilon(DELTA) <= 1


# The small tables where the public count_noise rule alone cost more than ε = 1 (breast-cancer
# 1.38, wine 7.68, digits 2.71 at their train splits, docs/results/tabular.csv): the default
# request's shape (n, features, classes), at δ = 1/n².
SMALL_TABLES = [
    ("breast-cancer", 569, 30, 2),
    ("breast-cancer train", 398, 30, 2),
    ("wine", 178, 13, 3),
    ("wine train", 124, 13, 3),
    ("digits train", 1257, 64, 10),
]


def _plan_default(n: int, d: int, k: int, epsilon: float, **params: object) -> tuple:  # type: ignore[type-arg]
    spec = registry.get("dpcda")
    facts = PublicFacts(n=n, n_features=d, n_classes=k)
    delta = 1.0 / n**2
    request = spec.request_params.model_validate(params)
    planned = spec.plan(request, facts, Target("tight", epsilon=epsilon, delta=delta))
    return spec, facts, delta, planned


@pytest.mark.parametrize(("name", "n", "d", "k"), SMALL_TABLES)
def test_the_default_request_at_epsilon_1_is_admitted_on_small_tables(
    name: str, n: int, d: int, k: int
) -> None:
    """The default request (params {}) goes through admission's path (shape defaults, checks,
    ``prepare``, calibration): count_noise is chosen for the target, larger than the public
    rule, the counts take at most a tenth of the target's μ², and the charge meets ε = 1."""
    spec, facts, delta, planned = _plan_default(n, d, k, 1.0)
    stored = planned.stored_params()
    m = stored["min_class_size"]
    assert stored["class_sizes"] == "dp"
    chosen = stored["count_noise"]
    assert chosen > default_count_noise(m, k)  # the public rule alone cost more than ε = 1
    assert chosen == count_noise_for_target(m, k, 1.0, delta)
    mu = gdp.mu_for_epsilon(1.0, delta)
    assert (math.sqrt(2) / chosen) ** 2 == pytest.approx(COUNTS_MU2_SHARE * mu**2, rel=1e-9)
    assert planned.epsilon <= 1.0
    # The job, the accountant and the preview see one release: the stored parameters carry
    # the chosen count_noise and β, and rebuild the charged event exactly at its σ.
    event = planned.event
    assert isinstance(event, DPCountsMixing)
    assert event.count_noise == chosen == planned.noise.sigma("counts")
    assert stored["class_size_failure_prob"] == event.failure_prob
    again = spec.event_at(
        Target("tight", sigma=planned.sigma), spec.params.model_validate(stored), facts
    )
    assert again == event
    assert again.epsilon(delta) == planned.epsilon


def test_the_default_count_noise_keeps_the_public_rule_where_it_is_cheaper() -> None:
    """Large classes or a large ε: the public rule already takes less than the share, and
    stays (n = 10⁴, K = 10, m = 500 at ε = 4)."""
    _, _, _, planned = _plan_default(10_000, 8, 10, 4.0)
    m = planned.stored_params()["min_class_size"]
    assert planned.stored_params()["count_noise"] == default_count_noise(m, 10)
    assert planned.epsilon <= 4.0


def test_an_explicit_count_noise_is_kept() -> None:
    _, _, _, planned = _plan_default(10_000, 8, 10, 1.0, count_noise=50.0)
    assert planned.stored_params()["count_noise"] == 50.0
    assert planned.noise.sigma("counts") == 50.0
    # Too small for the target: refused, with the reason and the way out.
    with pytest.raises(ValueError, match=r"alone cost ε .*leave it out"):
        _plan_default(398, 30, 2, 1.0, count_noise=default_count_noise(99, 2))


def test_the_default_count_noise_leaves_room_for_dp_statistics() -> None:
    """With standardization 'dp' the counts take a share of what the statistics leave; only
    statistics that alone exceed the target are refused, and then named as the reason."""
    keys = {
        "n": 569,
        "mixture_degree": 16,
        "n_samples": 568,
        "clip_norm": 1.0,
        "n_classes": 2,
        "min_class_size": 142,
        "standardization": "dp",
        "d_x": 30,
    }
    delta = 1 / 569**2
    mu2 = gdp.mu_for_epsilon(1.0, delta) ** 2
    stats_noise = math.sqrt(2 * 30 / (0.5 * mu2))  # the statistics take half the target's μ²
    event = TIGHT.calibrate(1.0, delta, {**keys, "stats_noise": stats_noise})
    assert isinstance(event, DPCountsMixing)
    assert event.epsilon(delta) <= 1.0
    assert (math.sqrt(2) / event.count_noise) ** 2 == pytest.approx(
        COUNTS_MU2_SHARE * 0.5 * mu2, rel=1e-6
    )
    too_noisy = math.sqrt(2 * 30 / (1.1 * mu2))  # the statistics alone exceed the target
    with pytest.raises(ValueError, match=r"DP statistics .*raise stats_noise"):
        TIGHT.calibrate(1.0, delta, {**keys, "stats_noise": too_noisy})


def test_cli_account_chooses_the_same_count_noise() -> None:
    """`dprelease account --epsilon` prepares like admission: the same count_noise and cost."""
    from click.testing import CliRunner

    from dprelease_cli.main import cli

    delta = 1 / 569**2
    pairs = ["n=569", "mixture_degree=16", "n_samples=568", "clip_norm=1", "n_classes=2"]
    args = ["account", "dpcda", "--delta", str(delta), "--epsilon", "1", *pairs]
    result = CliRunner().invoke(cli, [*args, "min_class_size=142"], env={"DPRELEASE_KEY": ""})
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["event"]["count_noise"] == count_noise_for_target(142, 2, 1.0, delta)
    assert out["noise"]["analysis"]["count_noise"] == out["event"]["count_noise"]
    assert out["epsilon"] <= 1.0


def test_the_request_schema_states_the_defaults_and_the_relation() -> None:
    spec = registry.get("dpcda")
    schema = spec.request_params.model_json_schema()
    props = schema["properties"]
    assert props["class_sizes"]["default"] == "dp"
    assert "narrower neighbour" in props["class_sizes"]["description"]
    assert f"Default: {COUNT_NOISE_RULE}" in props["count_noise"]["description"]
    assert "chosen at admission for the target" in COUNT_NOISE_RULE
    assert "10% of the target's μ²" in COUNT_NOISE_RULE
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


@pytest.mark.parametrize(("name", "n", "d", "k"), SMALL_TABLES)
def test_the_preview_warns_where_classes_are_unlikely_to_reach_their_bounds(
    name: str, n: int, d: int, k: int
) -> None:
    """At ε = 1 on a small table the DP bounds' margin passes three quarters of a balanced
    class: the preview warns, naming the size a class needs; at MNIST's shape it does not."""
    spec, facts, _, planned = _plan_default(n, d, k, 1.0)
    params = spec.params.model_validate(planned.stored_params())
    (warning,) = spec.guidance.warnings(params, facts, planned.noise)  # type: ignore[misc]
    assert warning["code"] == "classes_may_not_mix"
    margin = planned.noise.sigma("counts") * float(
        -special.ndtri(planned.stored_params()["class_size_failure_prob"] / k)
    )
    assert f"about {params.min_class_size + margin:.0f} records or more" in warning["message"]
    spec, facts, _, planned = _plan_default(10_000, 784, 10, 1.0)
    params = spec.params.model_validate(planned.stored_params())
    assert spec.guidance.warnings(params, facts, planned.noise) == []  # type: ignore[misc]
    stored = {**planned.stored_params(), "class_sizes": "declared", "count_noise": None}
    declared = spec.params.model_validate(stored)
    assert spec.guidance.warnings(declared, facts, planned.noise) == []  # type: ignore[misc]


def test_secure_count_bounds_hold_for_the_noise_drawn_not_sigma_c_alone() -> None:
    """The `secure` sampler draws x_l + g·round(N/g), N ~ N(0, σ'²), σ' > σ_c: a margin from σ_c
    alone fails more often than β/K; the sampler's tail (σ', g) keeps it within β/K. Exact
    law, the input's lattice rounding taken at its worst (+g/2)."""
    from dpcore.mechanisms import noise
    from dpcore.mechanisms.dpcda.accounting_counts import COUNT_SENSITIVITY, bound_margin
    from dpcore.mechanisms.noise import SecureNoise

    sigma_c, K, beta = 118.0, 10, 1e-6
    secure = SecureNoise(SecureRandom.from_seed(0))
    spread, offset = noise.tail(secure, sigma=sigma_c, sensitivity=COUNT_SENSITIVITY, dim=K)
    plan = secure.plan(sigma=sigma_c, sensitivity=COUNT_SENSITIVITY, dim=K)
    assert (spread, offset) == (plan.sigma_effective, plan.lattice) and spread > sigma_c

    def failure(margin: float) -> float:
        """P[⌊Y − margin⌋ > N] = P[noise ≥ margin + 1], worst input rounding."""
        g = plan.lattice
        k = math.ceil((margin + 1 - g / 2) / g)
        return float(special.ndtr(-(k - 0.5) * g / plan.sigma_effective))

    assert failure(bound_margin(sigma_c, beta, K)) > 1.2 * beta / K
    assert failure(bound_margin(spread, beta, K) + offset) <= beta / K
    fast = FastNoise(SecureRandom.from_seed(0))
    assert noise.tail(fast, sigma=sigma_c, sensitivity=COUNT_SENSITIVITY, dim=K) == (sigma_c, 0.0)


def test_a_secure_release_sets_its_bounds_by_the_noise_drawn() -> None:
    from dpcore.mechanisms.dpcda.accounting_counts import bound_margin
    from dpcore.mechanisms.noise import SecureNoise

    # Count noise large enough that σ'/σ_c and the lattice move the bounds by whole records.
    params = {**PARAMS, "count_noise": 40.0, "min_class_size": 40}
    data = _data([600, 800])
    noise = noise_for("dpcda", params, facts_of(data), sigma=0.5)
    generator = SecureRandom.from_seed(0)
    secure = SecureNoise(generator)
    out = build(
        "dpcda", params, data, noise=noise, sampler=secure, generator=generator,
        device=torch.device("cpu"),
    )  # fmt: skip
    list(out.chunks)
    meta = out.preprocessing
    (plan,) = [p for key, p in secure.plans.items() if key[0] == 40.0 and key[2] == 2]
    beta = meta["class_size_failure_prob"]
    plain = np.floor(np.asarray(meta["dp_class_counts"]) - bound_margin(40.0, beta, 2))
    margin = bound_margin(plan.sigma_effective, beta, 2)
    expected = np.floor(np.asarray(meta["dp_class_counts"]) - margin - plan.lattice)
    assert meta["dp_class_size_lower_bounds"] == expected.astype(int).tolist()
    assert (expected < plain).all()  # σ_c's margin alone would have set higher bounds
