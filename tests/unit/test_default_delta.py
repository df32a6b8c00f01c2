"""The default δ rule (service.releases.service.default_delta; docs/privacy.md, "Default δ")."""

from __future__ import annotations

import random

import pytest

from dpcore.accounting.filter import Charge, Spend, spend
from dpcore.accounting.orders import ORDERS
from service.models import DatasetBudget
from service.releases.service import MIN_DEFAULT_DELTA_SHARE, default_delta

EPS, DELTA = 10.0, 1e-5


def _budget() -> DatasetBudget:
    return DatasetBudget(dataset_id="ds", epsilon=EPS, delta=DELTA)


def test_basic_defaults_are_the_budget_share_and_add_up_to_it() -> None:
    state = Spend(EPS, DELTA)
    for epsilon in (1.0, 2.5, 0.5, 6.0):
        delta = default_delta(_budget(), state, epsilon)
        assert delta == pytest.approx(DELTA * epsilon / EPS, rel=1e-8)
        state = state.add(Charge("basic", epsilon, delta))
    assert state.epsilon == EPS and state.delta <= DELTA
    assert state.within_budget()


def test_only_the_whole_epsilon_left_gets_the_whole_delta_left() -> None:
    state = spend(EPS, DELTA, [Charge("basic", 0.5, 9.9e-6)])  # an explicit, greedy δ
    left = state.delta_left
    assert default_delta(_budget(), state, 9.5) == left
    assert default_delta(_budget(), state, 20.0) == left
    share = default_delta(_budget(), state, 0.5)
    assert share == pytest.approx(left * 0.5 / 9.5, rel=1e-8) and share < left


def test_an_epsilon_of_zero_still_gets_a_delta_in_the_open_interval() -> None:
    delta = default_delta(_budget(), Spend(EPS, DELTA), 0.0)
    assert delta == pytest.approx(DELTA * MIN_DEFAULT_DELTA_SHARE, rel=1e-8)
    assert 0 < delta < 1


def test_no_delta_left_gives_the_budget_share() -> None:
    state = spend(EPS, DELTA, [Charge("basic", 1.0, DELTA)])
    assert default_delta(_budget(), state, 1.0) == pytest.approx(DELTA / EPS, rel=1e-8)


@pytest.mark.parametrize("explicit", [0.0, 0.15])
def test_defaults_never_make_delta_bind_before_epsilon(explicit: float) -> None:
    # Adaptive sequences of default releases, with Rényi groups and (second case) explicit δ's
    # up to all that is left: a default always fits the δ left, and without explicit δ's the
    # δ left stays positive while ε is left.
    rng = random.Random(3)
    curve = tuple(0.001 * a for a in ORDERS)
    for _ in range(300):
        state = Spend(EPS, DELTA)
        for _ in range(40):
            epsilon_left = EPS - state.epsilon
            if epsilon_left <= 1e-6:
                break
            epsilon = epsilon_left * rng.choice([0.0, 1e-9, 0.01, 0.1, 0.5, 0.99])
            if rng.random() < explicit and state.delta_left > 0:
                delta = state.delta_left * rng.random()
            else:
                delta = default_delta(_budget(), state, epsilon)
                if state.delta_left > 0:
                    assert 0 < delta < state.delta_left
                    assert state.add(Charge("basic", epsilon, delta)).delta <= DELTA
            _, after = state.choose(epsilon, delta, curve if rng.random() < 0.3 else None)
            if after.within_budget():
                state = after
            if not explicit and EPS - state.epsilon > 1e-6:
                assert state.delta_left > 0
