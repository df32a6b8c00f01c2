"""MST: its accountant against independent figures, its sensitivities against worst-case
neighbours, its selection's law, its public discretisation, and its admission."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpcore.accounting import gdp
from dpcore.categorical import column_count, columns_of
from dpcore.domain import MissingIndicator
from dpcore.marginals import discretise
from dpcore.marginals.exponential import _accepts, acceptance_bounds, exponential_mechanism
from dpcore.mechanisms import registry
from dpcore.mechanisms.mst.accounting import HISTOGRAM_SENSITIVITY, MSTEvent
from dpcore.mechanisms.mst.selection import (
    SCORE_GRID,
    SCORE_SENSITIVITY,
    pair_scores,
    selection_rate,
)
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams, PublicFacts

pytestmark = pytest.mark.unit

DELTA = 1e-5


def test_event_splits_the_budget_evenly_and_declares_its_noise() -> None:
    event = MSTEvent(n_columns=9, sigma=7.0)  # k = 10 attributes with the label
    k = 10
    assert event.mu_one_way == pytest.approx(math.sqrt(2 * k) / 7.0)
    assert event.mu_two_way == pytest.approx(event.mu_one_way)
    # (k − 1) rounds of ε₀²/8-zCDP take the same share as either Gaussian step (μ²/2).
    assert (k - 1) * event.selection_epsilon**2 / 8 == pytest.approx(event.mu_one_way**2 / 2)
    noise = event.noise()
    assert [s.name for s in noise.scales] == ["one_way", "two_way"]
    assert all(s.sensitivity == HISTOGRAM_SENSITIVITY for s in noise.scales)
    assert noise.sigma("two_way") == pytest.approx(7.0 * math.sqrt(9 / 10))
    assert noise.analysis["attributes"] == k


def test_cost_lies_between_its_gaussian_steps_alone_and_basic_composition() -> None:
    for columns, sigma in [(3, 4.0), (30, 20.0), (100, 60.0)]:
        event = MSTEvent(columns, sigma)
        eps = event.epsilon(DELTA)
        # Lower bound: the two Gaussian steps alone, exactly (GDP); the selection adds to it.
        gaussian = gdp.epsilon_of(math.hypot(event.mu_one_way, event.mu_two_way), DELTA)
        assert gaussian < eps
        # Upper bound: basic composition of the Gaussian steps at δ/2 and the pure ε₀ rounds.
        basic = gdp.epsilon_of(math.hypot(event.mu_one_way, event.mu_two_way), DELTA / 2)
        assert eps <= basic + event.rounds * event.selection_epsilon
        assert MSTEvent(columns, sigma * 1.1).epsilon(DELTA) < eps


def test_the_label_structure_is_two_gaussian_steps_converted_exactly() -> None:
    event = MSTEvent(n_columns=9, sigma=7.0, structure="label")
    assert event.mu_two_way == pytest.approx(2 * event.mu_one_way)
    assert event.mu == pytest.approx(math.hypot(event.mu_one_way, event.mu_two_way))
    assert event.epsilon(DELTA) == pytest.approx(gdp.epsilon_of(event.mu, DELTA))
    assert "selection_epsilon" not in event.noise().analysis
    # No selection to pay for: at the same one-way noise the label structure costs its two
    # Gaussian steps only, and the tree structure's selection adds to its own.
    tree = MSTEvent(n_columns=9, sigma=7.0)
    assert tree.epsilon(DELTA) > gdp.epsilon_of(math.hypot(tree.mu_one_way, tree.mu_two_way), DELTA)


def test_calibration_never_overshoots_the_target() -> None:
    spec = registry.get("mst")
    facts = PublicFacts(n=2000, n_features=12, n_classes=2, n_columns=8)
    for target, structure in ((0.3, "tree"), (1.0, "tree"), (10.0, "tree"), (1.0, "label")):
        planned = spec.plan(
            spec.request_params.model_validate({"structure": structure}),
            facts,
            Target("tight", epsilon=target, delta=DELTA),
        )
        assert planned.cost.epsilon <= target
        assert planned.cost.epsilon == pytest.approx(target, rel=1e-4)
        assert planned.event.noise().analysis["attributes"] == 9


def _codes(rows: np.ndarray) -> np.ndarray:
    return rows.astype(np.int64)


def test_histogram_sensitivity_is_attained_by_a_replaced_record() -> None:
    rng = np.random.default_rng(0)
    sizes = [4, 3, 2]
    D = np.stack([rng.integers(s, size=50) for s in sizes], axis=1)
    worst = 0.0
    for _ in range(200):
        neighbour = D.copy()
        i = rng.integers(len(D))
        neighbour[i] = [rng.integers(s) for s in sizes]
        for a, s in enumerate(sizes):
            diff = np.bincount(D[:, a], minlength=s) - np.bincount(neighbour[:, a], minlength=s)
            worst = max(worst, float(np.linalg.norm(diff)))
    assert worst == pytest.approx(HISTOGRAM_SENSITIVITY)


def test_score_sensitivity_bounds_and_is_attained_by_worst_case_neighbours() -> None:
    sizes = [2, 2]
    pairs = [(0, 1)]
    # The estimate puts all its mass on cell (0, 0): moving a record from (0, 0) to (1, 1)
    # widens the gap in both cells (one fewer where the estimate exceeds the count, one more
    # where it falls short): the score moves by exactly 2H.
    noisy = [np.array([10.0, 0.0]), np.array([10.0, 0.0])]
    D = np.array([[0, 0]] * 6 + [[1, 1]] * 4)
    neighbour = D.copy()
    neighbour[0] = [1, 1]
    moved = pair_scores(neighbour, sizes, noisy, pairs) - pair_scores(D, sizes, noisy, pairs)
    assert abs(int(moved[0])) == SCORE_SENSITIVITY == 2 * SCORE_GRID
    rng = np.random.default_rng(1)
    for _ in range(300):
        noisy = [rng.normal(5, 3, 2), rng.normal(5, 3, 2)]
        D = rng.integers(2, size=(10, 2))
        neighbour = D.copy()
        neighbour[rng.integers(10)] = rng.integers(2, size=2)
        moved = pair_scores(neighbour, sizes, noisy, pairs) - pair_scores(D, sizes, noisy, pairs)
        assert abs(int(moved[0])) <= SCORE_SENSITIVITY


def test_selection_rate_is_exact_and_never_above_the_charge() -> None:
    for eps in (1e-3, 0.37, 2.0, 17.5):
        rate = selection_rate(eps)
        assert 2 * rate * SCORE_SENSITIVITY <= Fraction(eps)
        assert float(2 * rate * SCORE_SENSITIVITY) == pytest.approx(eps, rel=1e-9)


def test_acceptance_bounds_bracket_the_probability() -> None:
    import mpmath

    rate = Fraction(3, 1 << 10)
    gaps = [0, 1, 7, 250, 4000]
    lower, upper = acceptance_bounds(gaps, rate)
    mpmath.mp.prec = 200
    for gap, lo, hi in zip(gaps[1:], lower[1:], upper[1:], strict=True):
        exact = mpmath.exp(-mpmath.mpf(rate.numerator) * gap / rate.denominator) * 2**64
        assert int(lo) <= exact < int(hi) and int(hi) - int(lo) <= 2


def test_an_undecided_proposal_is_compared_exactly_on_further_words() -> None:
    import mpmath

    x = Fraction(5, 7)
    mpmath.mp.prec = 300
    p = mpmath.exp(-mpmath.mpf(5) / 7)
    head = int(mpmath.floor(p * 2**64))  # the word on the boundary: 64 bits cannot decide
    for seed in range(4):
        next_word = int(SecureRandom.from_seed(seed).words(1)[0])
        expected = (head * 2**64 + next_word + 1) <= p * 2**128
        assert _accepts(x, head, SecureRandom.from_seed(seed)) == expected


def test_the_selection_reads_the_same_words_on_neighbouring_scores() -> None:
    scores = np.array([3000, 2900, 2950, 100, 2999])
    moved = scores + np.array([SCORE_SENSITIVITY, -SCORE_SENSITIVITY, 0, 5, -3])
    rate = selection_rate(0.5)
    positions = []
    for s in (scores, moved):
        source = SecureRandom.from_seed(9)
        exponential_mechanism(s, rate, source)
        positions.append(source.position)
    assert positions[0] == positions[1]


def test_exponential_mechanism_draws_its_law() -> None:
    source = SecureRandom.from_seed(4)
    scores = np.array([0, 64, 128, 200, 200])
    rate = Fraction(1, 64)
    draws = 6000
    counts = np.bincount(
        [exponential_mechanism(scores, rate, source) for _ in range(draws)], minlength=5
    )
    weights = np.exp(float(rate) * scores)
    expected = draws * weights / weights.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    # A wrong law (twice the rate) is told apart by the same draws.
    wrong = np.exp(2 * float(rate) * scores)
    assert stats.chisquare(counts, draws * wrong / wrong.sum()).pvalue < 1e-6


def test_layout_counts_the_declared_columns_and_round_trips() -> None:
    names = ["age", "age_missing", "ward=A", "ward=B", "ward=C", "sys"]
    blocks = [(2, 3, 4)]
    indicators = [MissingIndicator(1, (0,), (50.0,))]
    attributes = discretise.layout(names, blocks, indicators, n_classes=3, bins=8)
    assert [a.kind for a in attributes] == ["numeric", "binary", "categorical", "numeric", "label"]
    assert len(attributes) == columns_of(len(names), blocks) + 1
    declared: list[dict[str, Any]] = [
        {"name": "age", "type": "numeric", "bounds": [0, 100], "missing": {"policy": "indicator"}},
        {"name": "ward", "type": "categorical", "categories": ["A", "B", "C"]},
        {"name": "sys", "type": "numeric", "bounds": [80, 200]},
    ]
    assert column_count(declared) == columns_of(len(names), blocks)
    rng = np.random.default_rng(0)
    n = 200
    unit = np.zeros((n, len(names)))
    unit[:, 0] = rng.random(n)
    unit[:, 1] = rng.integers(2, size=n)
    unit[np.arange(n), 2 + rng.integers(3, size=n)] = 1
    unit[:, 5] = rng.random(n)
    labels = rng.integers(3, size=n)
    codes = discretise.encode(unit, labels, attributes)
    back, back_labels = discretise.decode(codes, attributes, len(names), rng)
    assert np.array_equal(discretise.encode(back, back_labels, attributes), codes)
    assert np.array_equal(back[:, 1:5], unit[:, 1:5]) and np.array_equal(back_labels, labels)
    assert ((back >= 0) & (back <= 1)).all()


def test_an_empty_categorical_block_is_a_value_of_its_own() -> None:
    names = ["ward=A", "ward=B", "ward_missing"]
    attributes = discretise.layout(names, [(0, 1)], [MissingIndicator(2, (0, 1), (0.0, 0.0))], 2, 4)
    assert attributes[0].size == 3 and attributes[0].empty
    unit = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    codes = discretise.encode(unit, np.array([0, 1]), attributes)
    assert codes[:, 0].tolist() == [0, 2]
    back, _ = discretise.decode(codes, attributes, 3, np.random.default_rng(0))
    assert np.array_equal(back, unit)


def test_a_one_category_block_left_empty_is_a_value_of_its_own() -> None:
    names = ["ward=A", "ward_missing", "age", "age_missing"]
    indicators = [MissingIndicator(1, (0,), (0.0,)), MissingIndicator(3, (2,), (0.0,))]
    attributes = discretise.layout(names, [(0,)], indicators, 2, 4)
    assert attributes[0].size == 2 and attributes[0].empty
    # A numeric column's indicator (fill 0) makes no categorical value of its own.
    assert not any(a.empty for a in attributes[1:])


def test_bins_default_from_the_public_row_count() -> None:
    from dpcore.marginals.discretise import default_bins

    assert [default_bins(n) for n in (10, 124, 398, 1257, 7000)] == [4, 4, 8, 16, 16]
    spec = registry.get("mst")
    facts = PublicFacts(n=398, n_features=30, n_classes=2)
    resolved = spec.resolve(spec.request_params.model_validate({}), facts)
    assert resolved.bins == 8  # type: ignore[attr-defined]
    asked = spec.resolve(spec.request_params.model_validate({"bins": 32}), facts)
    assert asked.bins == 32  # type: ignore[attr-defined]


def test_admission_refuses_wide_data_and_warns_of_bins_lost_in_noise() -> None:
    spec = registry.get("mst")
    params = spec.request_params.model_validate({})
    wide = PublicFacts(n=10_000, n_features=784, n_classes=10, feature_shape=(28, 28))
    with pytest.raises(InvalidParams, match="clustmix"):
        spec.plan(params, wide, Target("tight", epsilon=1.0, delta=DELTA))
    tall = PublicFacts(n=1_000_000, n_features=100, n_classes=2)
    with pytest.raises(InvalidParams, match='structure "label"'):
        spec.plan(params, tall, Target("tight", epsilon=1.0, delta=DELTA))
    label = spec.request_params.model_validate({"structure": "label"})
    spec.plan(label, tall, Target("tight", epsilon=1.0, delta=DELTA))
    small = PublicFacts(n=150, n_features=13, n_classes=3)
    planned = spec.plan(params, small, Target("tight", epsilon=1.0, delta=DELTA))
    warnings = spec.guidance.warnings(planned.params, small, planned.event.noise())  # type: ignore[misc]
    assert [w["code"] for w in warnings] == ["bins_lost_in_noise"]
    large = PublicFacts(n=50_000, n_features=13, n_classes=3)
    planned = spec.plan(params, large, Target("tight", epsilon=1.0, delta=DELTA))
    assert spec.guidance.warnings(planned.params, large, planned.event.noise()) == []  # type: ignore[misc]


@pytest.mark.parametrize("shrink", [1.0, 4.0])
def test_audit_of_the_one_way_step_catches_too_little_noise(shrink: float) -> None:
    from dpcore.audit.harness import run_audit

    def planted(fn):  # type: ignore[no-untyped-def]
        return lambda counts, sigma, sampler: fn(counts, sigma / shrink, sampler)

    result = run_audit("mst", {"n": 3}, delta=1e-2, epsilon=2.0, trials=4000, wrap=planted)
    if shrink == 1.0:
        assert result["epsilon_lower_bound"] < result["epsilon_claimed"]
    else:
        assert result["epsilon_lower_bound"] > result["epsilon_claimed"]


@pytest.mark.slow
@pytest.mark.parametrize("structure", ["tree", "label"])
def test_a_release_is_records_in_the_declared_domain(structure: str) -> None:
    import torch

    from bench.tabular_data import mixed
    from dpcore.mechanisms.noise import FastNoise
    from dpcore.mechanisms.run import build, facts_of, materialise

    table = mixed(600)
    data = table.private
    spec = registry.get("mst")
    facts = facts_of(data)
    assert facts.keys()["n_columns"] == columns_of(data.n_features, data.categorical_blocks)
    planned = spec.plan(
        spec.request_params.model_validate({"iterations": 50, "bins": 8, "structure": structure}),
        facts,
        Target("tight", epsilon=2.0, delta=DELTA),
    )
    noise = planned.event.noise()
    phases: list[str] = []
    source = SecureRandom.from_seed(5)
    output = build(
        spec,
        planned.params,
        data,
        noise=noise,
        sampler=FastNoise(source),
        generator=source,
        device=torch.device("cpu"),
        report=lambda done, total, phase: phases.append(phase),
    )
    X, Y, X_drawn, _ = materialise(output)
    assert X.shape == (data.n_rows, data.n_features) and np.array_equal(X, X_drawn)
    assert ((data.lo - 1e-4 <= X) & (data.hi + 1e-4 >= X)).all()
    for block in data.categorical_blocks:
        assert (X[:, list(block)].sum(axis=1) == 1).all()
        assert set(np.unique(X[:, list(block)])) == {0.0, 1.0}
    for indicator in data.missing_indicators:
        assert set(np.unique(X[:, indicator.indicator])) <= {0.0, 1.0}
    assert (Y.sum(axis=1) == 1).all() and len(np.unique(Y.argmax(axis=1))) == 2
    expected = {"measuring", "fitting", "sampling"} | (
        {"selecting"} if structure == "tree" else set()
    )
    assert set(phases) == expected
    # A release charged for another table's columns is refused before any noise is drawn.
    other = MSTEvent(facts.keys()["n_columns"] + 1, noise.sigma_x, structure).noise()
    with pytest.raises(ValueError, match="charged for"):
        build(
            spec,
            planned.params,
            data,
            noise=other,
            sampler=FastNoise(source),
            generator=source,
            device=torch.device("cpu"),
        )
