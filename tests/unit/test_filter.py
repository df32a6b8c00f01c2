"""dpcore.accounting.filter: the ledger's privacy filter (docs/privacy.md, "The ledger")."""

from __future__ import annotations

import math
import random

import pytest

from dpcore.accounting import gdp
from dpcore.accounting.filter import (
    FILTER_ORDERS,
    GROUP_DELTA_SHARE,
    Charge,
    Spend,
    renyi_epsilon,
    spend,
)
from dpcore.accounting.orders import ORDERS

EPS, DELTA = 1.0, 1e-5


def _gaussian_curve(mu: float) -> tuple[float, ...]:
    return tuple(a * mu * mu / 2 for a in ORDERS)


def test_grid_is_a_subset_of_the_stored_orders() -> None:
    assert set(FILTER_ORDERS) <= set(ORDERS)
    assert list(FILTER_ORDERS) == sorted(set(FILTER_ORDERS))


def test_basic_charges_add_up_in_epsilon_and_delta() -> None:
    state = spend(EPS, DELTA, [Charge("basic", 0.25, 2e-6), Charge("basic", 0.5, 3e-6)])
    assert state.epsilon == 0.75 and state.delta == pytest.approx(5e-6, rel=1e-15)
    assert state.delta_left == pytest.approx(5e-6, rel=1e-12)
    assert state.within_budget()
    assert not state.add(Charge("basic", 0.3, 0.0)).within_budget()
    assert not state.add(Charge("basic", 0.1, 6e-6)).within_budget()


def test_one_release_may_use_the_whole_budget_as_a_basic_charge() -> None:
    # A PLD-calibrated release of exactly (ε_B, δ_B), with an RDP curve much worse than that.
    curve = _gaussian_curve(2.0)
    charge, after = Spend(EPS, DELTA).choose(EPS, DELTA, curve)
    assert charge.mode == "basic" and after.within_budget()
    assert after.epsilon == EPS and after.delta == DELTA


def test_renyi_group_takes_a_share_of_the_delta_left_and_converts_with_the_split() -> None:
    mu = 0.05
    curve = _gaussian_curve(mu)
    state = spend(EPS, DELTA, [Charge("basic", 0.2, 4e-6)])
    charge, after = state.choose(0.5, 6e-6, curve)
    # The group reserves the release's share of the ε left (0.5 of 0.8), above the floor
    # GROUP_DELTA_SHARE, of the 6e-6 left: never every δ left.
    assert charge.mode == "renyi"
    assert charge.group_delta == pytest.approx(6e-6 * 0.5 / 0.8, rel=1e-12)
    expected = min(
        a * mu * mu / 2 + math.log(len(FILTER_ORDERS) / charge.group_delta) / (a - 1)
        for a in FILTER_ORDERS
    )
    assert after.epsilon == pytest.approx(0.2 + expected, rel=1e-12)
    assert after.delta == pytest.approx(4e-6 + charge.group_delta, rel=1e-12)
    # The rest of δ stays for basic charges; a renyi one joins the group.
    rest = after.delta_left
    assert rest == pytest.approx(6e-6 - charge.group_delta, rel=1e-9)
    assert after.add(Charge("basic", 0.01, rest)).within_budget()
    assert not after.add(Charge("basic", 0.01, rest * 1.01)).within_budget()
    joined = after.add(Charge("renyi", 0.0, 0.0, curve, charge.group_delta))
    assert joined.delta == after.delta and joined.group_delta == charge.group_delta
    assert joined.epsilon > after.epsilon


def test_new_group_delta_is_a_share_unless_the_whole_epsilon_left_is_asked() -> None:
    state = spend(EPS, DELTA, [Charge("basic", 0.2, 4e-6)])
    left = state.delta_left
    assert state.new_group_delta(0.01) == pytest.approx(left * GROUP_DELTA_SHARE, rel=1e-12)
    assert state.new_group_delta(0.6) == pytest.approx(left * 0.6 / 0.8, rel=1e-12)
    assert state.new_group_delta(0.8) == left  # the whole ε left: the whole δ left
    assert state.new_group_delta(5.0) == left
    assert 0 < GROUP_DELTA_SHARE < 1


def test_choice_prefers_the_smaller_spend_and_basic_on_ties() -> None:
    curve = _gaussian_curve(0.05)
    state = Spend(10.0, DELTA)
    big = state.choose(5.0, DELTA / 2, curve)[0]
    assert big.mode == "renyi"  # a curve this small converts far below ε = 5
    small = state.choose(0.01, DELTA / 2, curve)[0]
    assert small.mode == "basic"
    assert state.choose(0.5, DELTA / 2, None)[0].mode == "basic"


def test_nothing_fits_reports_the_smallest_spend() -> None:
    charge, after = Spend(EPS, DELTA).choose(3.0, DELTA, None)
    assert charge.mode == "basic" and not after.within_budget()


@pytest.mark.parametrize("k", [1, 4, 30])
@pytest.mark.parametrize("mu", [0.05, 0.3, 1.0])
def test_renyi_group_never_claims_less_than_the_exact_composition(k: int, mu: float) -> None:
    # k Gaussian mechanisms chosen in advance compose exactly to √k·μ-GDP: no valid filter can
    # report less than that mechanism's exact ε at the δ it holds.
    curve = _gaussian_curve(mu)
    state = Spend(1e6, DELTA)
    for _ in range(k):
        group = state.group_delta if state.renyi is not None else state.delta_left
        state = state.add(Charge("renyi", 0.0, 0.0, curve, group))
    exact = gdp.epsilon_of(math.sqrt(k) * mu, state.delta)
    assert state.epsilon >= exact
    # … and is not absurdly loose either (the log|Λ| split costs a few tens of per cent).
    assert state.epsilon <= 2.0 * exact + 0.5


def test_renyi_epsilon_needs_a_positive_group_delta() -> None:
    assert renyi_epsilon([0.0] * len(FILTER_ORDERS), 0.0) == math.inf


def test_charges_validate() -> None:
    with pytest.raises(ValueError):
        Charge("basic", math.inf, 0.0)
    with pytest.raises(ValueError):
        Charge("renyi", 0.0, 0.0, None, 1e-6)
    with pytest.raises(ValueError):
        Charge("renyi", 0.0, 0.0, _gaussian_curve(1.0), 0.0)
    with pytest.raises(ValueError):
        Charge("renyi", 0.0, 0.0, (math.nan,) * len(ORDERS), 1e-6)
    with pytest.raises(ValueError):
        Charge("other", 0.0, 0.0)  # type: ignore[arg-type]


def test_groups_that_disagree_are_counted_conservatively() -> None:
    curve = _gaussian_curve(0.1)
    state = spend(
        EPS, DELTA, [Charge("renyi", 0, 0, curve, 2e-6), Charge("renyi", 0, 0, curve, 5e-6)]
    )
    assert state.delta == pytest.approx(5e-6, rel=1e-12)
    assert state.group_delta == 2e-6


def test_a_group_taking_the_delta_left_always_fits() -> None:
    # budget − spent, added back in floating point, can land one ulp above the budget: the
    # δ left is rounded down so the Rényi way is never lost to rounding.
    curve = _gaussian_curve(0.01)
    rng = random.Random(7)
    for _ in range(2000):
        spent = [rng.uniform(0, 3e-6) for _ in range(3)]
        state = spend(100.0, DELTA, [Charge("basic", 0.1, d) for d in spent])
        group = state.delta_left
        assert group + state.delta <= DELTA
        after = state.add(Charge("renyi", 0.0, 0.0, curve, group))
        assert after.within_budget()


def test_delta_sums_round_against_the_user() -> None:
    """Two δs whose exact sum passes the budget by less than an ulp: a float sum rounded to
    nearest would fit; the filter's does not. Checked against exact rationals."""
    from fractions import Fraction

    from dpcore.accounting.filter import sum_up

    rng = random.Random(5)
    refused = 0
    for _ in range(2000):
        a = rng.uniform(1e-7, 1e-5)
        budget = rng.uniform(1.5e-5, 3e-5)
        b = budget - a  # rounded to nearest: the exact a + b may pass the budget
        exact = Fraction(a) + Fraction(b)
        assert Fraction(sum_up(a, b)) >= exact
        assert Fraction(sum_up(a, b)) - exact < Fraction(math.ulp(a + b))
        state = Spend(1.0, budget).add(Charge("basic", 0.1, a)).add(Charge("basic", 0.1, b))
        assert state.within_budget() == (exact <= Fraction(budget))
        refused += exact > Fraction(budget)
    assert refused > 100  # the case arises, and is refused
