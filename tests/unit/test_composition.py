"""dpcore.accounting.composition: Cost validation and compose_epsilon's two bounds."""

from __future__ import annotations

import math
from functools import cache

import pytest

from dpcore.accounting.composition import Cost, compose_epsilon
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.mechanisms.dpmix.accounting import DPMixEvent

DELTA = 1e-5


@cache
def event_curve(n_samples: int) -> tuple[float, ...]:
    return DPMixEvent(2_000, 16, n_samples, 0.08, 0.08).rdp()


def dpmix_cost(n_samples: int, delta: float = DELTA) -> Cost:
    curve = event_curve(n_samples)
    return Cost(epsilon=epsilon_from_rdp(curve, delta=delta), delta=delta, rdp=curve)


def hand_epsilon(curve: tuple[float, ...] | list[float], delta: float) -> float:
    """Balle et al. 2020 conversion over the finite orders α > 1.01, by hand."""
    best = math.inf
    for alpha, r in zip(ORDERS, curve, strict=True):
        if alpha > 1.01 and math.isfinite(r):
            value = r + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
            best = min(best, value)
    return max(0.0, best)


def test_empty_is_free() -> None:
    assert compose_epsilon([], delta=DELTA) == 0.0


def test_single_cost_rdp_better_than_stated() -> None:
    curve = event_curve(200)
    rdp_eps = epsilon_from_rdp(curve, delta=DELTA)
    cost = Cost(epsilon=rdp_eps + 1.0, delta=DELTA, rdp=curve)
    assert compose_epsilon([cost], delta=DELTA) == rdp_eps
    assert rdp_eps == pytest.approx(hand_epsilon(curve, DELTA), rel=1e-12)


def test_single_cost_stated_better_than_rdp() -> None:
    curve = event_curve(200)
    rdp_eps = epsilon_from_rdp(curve, delta=DELTA)
    cost = Cost(epsilon=rdp_eps / 2, delta=DELTA / 2, rdp=curve)
    assert compose_epsilon([cost], delta=DELTA) == rdp_eps / 2


def test_single_cost_stated_delta_too_large() -> None:
    curve = event_curve(200)
    rdp_eps = epsilon_from_rdp(curve, delta=DELTA)
    # The stated (ε, δ) does not fit the budget's δ, so only the curve can be used.
    cost = Cost(epsilon=rdp_eps / 2, delta=2 * DELTA, rdp=curve)
    assert compose_epsilon([cost], delta=DELTA) == rdp_eps


def test_two_identical_events_equal_one_with_double_T() -> None:
    one = dpmix_cost(150)
    doubled = DPMixEvent(2_000, 16, 300, 0.08, 0.08)
    composed = compose_epsilon([one, one], delta=DELTA)
    # Σδ = 2δ exceeds the budget, so this is the RDP path, converted at the full δ.
    assert composed == doubled.epsilon(DELTA)
    assert composed == pytest.approx(hand_epsilon(doubled.rdp(), DELTA), rel=1e-12)
    assert composed < 2 * one.epsilon


def test_rdp_and_basic_compared() -> None:
    # Σδ fits, so basic composition is available, but the RDP path is better here.
    a = dpmix_cost(150, delta=DELTA / 4)
    composed = compose_epsilon([a, a], delta=DELTA)
    assert composed == epsilon_from_rdp([2 * r for r in a.rdp or ()], delta=DELTA)
    assert composed < 2 * a.epsilon


def test_basic_composition_without_curves() -> None:
    costs = [Cost(1.0, 1e-6), Cost(0.25, 2e-6), Cost(2.0, 0.0)]
    assert compose_epsilon(costs, delta=DELTA) == 3.25
    # exactly at the budget still fits
    assert compose_epsilon([Cost(1.0, 4e-6), Cost(1.0, 6e-6)], delta=1e-5) == 2.0


def test_basic_composition_wins_over_a_bad_curve() -> None:
    bad_curve = tuple(1e3 for _ in ORDERS)
    costs = [Cost(0.5, 1e-6, rdp=bad_curve), Cost(0.5, 1e-6)]
    assert compose_epsilon(costs, delta=DELTA) == 1.0


def test_nothing_fits_is_inf() -> None:
    assert compose_epsilon([Cost(1.0, 6e-6), Cost(1.0, 6e-6)], delta=DELTA) == math.inf
    # a curve does not help when the curve-less costs alone use the whole δ
    costs = [dpmix_cost(10), Cost(1.0, DELTA)]
    assert compose_epsilon(costs, delta=DELTA) == math.inf


def test_curveless_costs_consume_delta_of_rdp_conversion() -> None:
    with_curve = dpmix_cost(150)
    other = Cost(0.5, 4e-6)
    # Σδ = 1.4e-5 > δ: basic composition does not apply, only RDP at the remaining δ.
    got = compose_epsilon([with_curve, other], delta=DELTA)
    expected = epsilon_from_rdp(with_curve.rdp or (), delta=DELTA - 4e-6) + 0.5
    assert got == pytest.approx(expected, rel=1e-14)
    assert expected == pytest.approx(hand_epsilon(with_curve.rdp or (), 6e-6) + 0.5, rel=1e-12)
    # the δ was really taken away: converting at the full δ would give less
    assert got > epsilon_from_rdp(with_curve.rdp or (), delta=DELTA) + 0.5


def test_curveless_costs_order_does_not_matter() -> None:
    costs = [dpmix_cost(150), Cost(0.5, 4e-6), dpmix_cost(10), Cost(0.1, 1e-6)]
    forward = compose_epsilon(costs, delta=DELTA)
    backward = compose_epsilon(costs[::-1], delta=DELTA)
    assert forward == pytest.approx(backward, rel=1e-14)
    curve = [a + b for a, b in zip(event_curve(150), event_curve(10), strict=True)]
    expected = hand_epsilon(curve, DELTA - 5e-6) + 0.6
    assert forward == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": -0.1, "delta": 0.0},
        {"epsilon": math.inf, "delta": 0.0},
        {"epsilon": math.nan, "delta": 0.0},
        {"epsilon": 1.0, "delta": 1.0},
        {"epsilon": 1.0, "delta": 1.5},
        {"epsilon": 1.0, "delta": -1e-9},
        {"epsilon": 1.0, "delta": 0.0, "rdp": (0.1,) * (len(ORDERS) - 1)},
        {"epsilon": 1.0, "delta": 0.0, "rdp": (0.1,) * (len(ORDERS) + 1)},
        {"epsilon": 1.0, "delta": 0.0, "rdp": ()},
    ],
)
def test_cost_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Cost(**kwargs)  # type: ignore[arg-type]


def test_cost_valid_edges() -> None:
    Cost(0.0, 0.0)
    Cost(0.0, 0.999)
    Cost(1.0, 0.0, rdp=(0.0,) * len(ORDERS))


def test_inf_in_curve_uses_finite_orders() -> None:
    finite = event_curve(150)
    curve = tuple(math.inf if a >= 40 else r for a, r in zip(ORDERS, finite, strict=True))
    eps = epsilon_from_rdp(curve, delta=DELTA)
    assert math.isfinite(eps)
    assert eps == pytest.approx(hand_epsilon(curve, DELTA), rel=1e-12)
    assert eps >= epsilon_from_rdp(finite, delta=DELTA)  # fewer orders: never better
    composed = compose_epsilon([Cost(100.0, DELTA, rdp=curve), dpmix_cost(10)], delta=DELTA)
    summed = [a + b for a, b in zip(curve, event_curve(10), strict=True)]
    assert math.isfinite(composed)
    assert composed == pytest.approx(hand_epsilon(summed, DELTA), rel=1e-12)


def test_all_inf_curve_falls_back_to_basic() -> None:
    curve = (math.inf,) * len(ORDERS)
    assert compose_epsilon([Cost(3.0, 1e-6, rdp=curve)], delta=DELTA) == 3.0
    assert compose_epsilon([Cost(3.0, 1e-4, rdp=curve)], delta=DELTA) == math.inf
