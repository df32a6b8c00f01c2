"""AIM: its accountant against independent bounds, its budget kept exactly, its score
sensitivity against worst-case neighbours, its noise floor, its audit and a release."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from dpcore.accounting import gdp
from dpcore.marginals.inference import JunctionTree
from dpcore.mechanisms import registry
from dpcore.mechanisms.aim.accounting import AIMEvent, gaussian_cost, selection_cost
from dpcore.mechanisms.aim.release import Budget, last_round
from dpcore.mechanisms.aim.selection import SCORE_GRID, Candidates, workload_weights
from dpcore.mechanisms.noise import DeclaredNoise, FastNoise, UndeclaredNoise
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams, PublicFacts

pytestmark = pytest.mark.unit

DELTA = 1e-5


def test_the_budget_is_rho_from_the_first_scale_and_its_epsilon_is_bracketed() -> None:
    for columns, sigma, rounds in [(3, 40.0, 64), (30, 160.0, 496), (100, 900.0, 1616)]:
        event = AIMEvent(columns, sigma, rounds)
        # T measurements at σ₀ (1/σ₀² each under replace-one) are nine tenths of ρ.
        assert event.rho == pytest.approx(rounds / sigma**2 / 0.9)
        assert (rounds * event.selection_epsilon**2 / 8) == pytest.approx(0.1 * event.rho)
        eps = event.epsilon(DELTA)
        # Above: the usual ρ-zCDP bound; below: one Gaussian step of the whole ρ (a run
        # that puts nearly all of it in one measurement realises it), converted exactly.
        assert eps <= event.rho + 2 * math.sqrt(event.rho * math.log(1 / DELTA))
        assert gdp.epsilon_of(math.sqrt(2 * event.rho), DELTA) <= eps


def test_calibration_never_overshoots_the_target() -> None:
    spec = registry.get("aim")
    for n, features, eps in [(500, 5, 1.0), (30_000, 40, 10.0), (2_000, 13, 0.3)]:
        facts = PublicFacts(n=n, n_features=features, n_classes=2)
        planned = spec.plan(
            spec.request_params.model_validate({}), facts, Target("tight", epsilon=eps, delta=DELTA)
        )
        assert planned.params.rounds == 16 * (features + 1)
        assert planned.event.epsilon(DELTA) <= eps
        assert planned.event.epsilon(DELTA) == pytest.approx(eps, rel=1e-3)


def test_the_last_round_takes_what_is_left_and_no_more() -> None:
    for left in (Fraction(1, 3), Fraction(7, 10**6), Fraction(123456789, 10**4)):
        sigma, epsilon = last_round(left)
        cost = gaussian_cost(sigma) + selection_cost(Fraction(epsilon))
        assert cost <= left
        assert float(cost) == pytest.approx(float(left), rel=1e-12)
    budget = Budget(0.5)
    budget.spend(Fraction(1, 4))
    with pytest.raises(ValueError, match="pass its budget"):
        budget.spend(Fraction(1, 4))


def test_score_sensitivity_bounds_and_is_attained_by_worst_case_neighbours() -> None:
    sizes = [3, 2, 2]
    rng = np.random.default_rng(0)
    codes = np.column_stack([rng.integers(0, s, 40) for s in sizes])
    # Record 0 sits in the pair (0, 1)'s most over-counted cell in D and moves to an empty one
    # in D′: both cells' errors shrink by H, the pair's score by its weight times 2H.
    codes[:, 0] = np.where(codes[:, 0] == 2, 1, codes[:, 0])
    codes[0, :2] = (0, 0)
    prime = codes.copy()
    prime[0, :2] = (2, 1)
    uniform = JunctionTree(sizes, {}, total=40.0)
    weights = workload_weights(len(sizes))
    moves = []
    for sigma in (0.5, 30.0):
        d, d_prime = Candidates(codes, sizes), Candidates(prime, sizes)
        cliques = d.cliques
        a, b = d.scores(cliques, uniform, sigma), d_prime.scores(cliques, uniform, sigma)
        moves.append(np.abs(a - b))
        assert d.sensitivity == 2 * SCORE_GRID * max(weights.values())
    assert (np.max(moves, axis=0) <= Candidates(codes, sizes).sensitivity).all()
    assert (
        moves[0][Candidates(codes, sizes).cliques.index((0, 1))] == 2 * SCORE_GRID * weights[(0, 1)]
    )


def test_a_scale_declared_at_least_takes_larger_sigmas_only() -> None:
    noise = AIMEvent(5, 50.0, 96).noise()
    floor = noise.scale("marginals")
    assert floor.at_least and floor.sigma == pytest.approx(50.0 / math.sqrt(96))
    sampler = DeclaredNoise(FastNoise(SecureRandom.from_seed(1)), noise)
    values = torch.zeros(20_000, dtype=torch.float64)
    drawn = sampler(values, sigma=floor.sigma * 3, sensitivity=math.sqrt(2))
    assert float(drawn.std()) == pytest.approx(floor.sigma * 3, rel=0.03)
    # Just above the floor, within the match tolerance: the σ asked for (and charged) is drawn.
    above = floor.sigma * (1 + 5e-10)
    assert sampler.scale_for(sigma=above, sensitivity=math.sqrt(2)).sigma == above
    with pytest.raises(UndeclaredNoise):
        sampler(values, sigma=floor.sigma * 0.99, sensitivity=math.sqrt(2))
    with pytest.raises(UndeclaredNoise):
        sampler(values, sigma=floor.sigma * 3, sensitivity=2.0)


def test_admission_refuses_wide_data_and_too_few_rounds() -> None:
    spec = registry.get("aim")
    wide = PublicFacts(n=1000, n_features=784, n_classes=10)
    with pytest.raises(InvalidParams, match="for tables"):
        spec.plan(
            spec.request_params.model_validate({}), wide, Target("tight", epsilon=1.0, delta=DELTA)
        )
    table = PublicFacts(n=1000, n_features=9, n_classes=2)
    with pytest.raises(InvalidParams, match="twice the attributes"):
        spec.plan(
            spec.request_params.model_validate({"rounds": 19}),
            table,
            Target("tight", epsilon=1.0, delta=DELTA),
        )


@pytest.mark.parametrize("shrink", [1.0, 16.0])
def test_audit_of_the_one_way_step_catches_too_little_noise(shrink: float) -> None:
    from dpcore.audit.harness import run_audit

    def planted(fn):  # type: ignore[no-untyped-def]
        return lambda counts, sigma, sampler: fn(counts, sigma / shrink, sampler)

    result = run_audit("aim", {"n": 3}, delta=1e-2, epsilon=2.0, trials=4000, wrap=planted)
    if shrink == 1.0:
        assert result["epsilon_lower_bound"] < result["epsilon_claimed"]
    else:
        assert result["epsilon_lower_bound"] > result["epsilon_claimed"]


@pytest.mark.slow
def test_a_release_is_records_in_the_declared_domain_within_its_budget() -> None:
    from bench.tabular_data import mixed
    from dpcore.mechanisms.run import build, facts_of, materialise

    table = mixed(600)
    data = table.private
    spec = registry.get("aim")
    facts = facts_of(data)
    # Two rounds (each compiles a model fit: the test's time): one planned round, then the
    # last, which takes what is left of the budget.
    planned = spec.plan(
        spec.request_params.model_validate({"iterations": 50, "bins": 8, "max_rounds": 2}),
        facts,
        Target("tight", epsilon=4.0, delta=DELTA),
    )
    noise = planned.event.noise()
    source = SecureRandom.from_seed(5)
    sigmas: list[float] = []
    inner = DeclaredNoise(FastNoise(source), noise)

    def recording(
        values: torch.Tensor, *, sigma: float, sensitivity: float, **kw: object
    ) -> torch.Tensor:
        sigmas.append(sigma)
        return inner(values, sigma=sigma, sensitivity=sensitivity, **kw)  # type: ignore[arg-type]

    phases: list[str] = []
    output = build(
        spec,
        planned.params,
        data,
        noise=noise,
        sampler=recording,  # type: ignore[arg-type]
        generator=source,
        device=torch.device("cpu"),
        report=lambda done, total, phase: phases.append(phase),
    )
    X, Y, _, _ = materialise(output)
    assert X.shape == (data.n_rows, data.n_features)
    assert ((data.lo - 1e-4 <= X) & (data.hi + 1e-4 >= X)).all()
    for block in data.categorical_blocks:
        assert (X[:, list(block)].sum(axis=1) == 1).all()
    assert (Y.sum(axis=1) == 1).all()
    assert set(phases) == {"measuring", "rounds", "sampling"}
    # The one-way step, then both rounds; every Gaussian step together within ρ.
    k = int(noise.analysis["attributes"])
    assert len(sigmas) == k + 2
    spent = sum(gaussian_cost(s) for s in sigmas)
    assert spent <= Fraction(noise.analysis["rho"]) * Fraction(9, 10) + Fraction(
        1, 10**9
    ) or spent <= Fraction(noise.analysis["rho"])
