"""μ-GDP conversion and composition, against independent evaluations."""

from __future__ import annotations

import math

import dp_accounting as dpa
import mpmath as mp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accounting import Cost, compose_epsilon, gdp
from dpcore.accounting.orders import ORDERS


def _delta_mp(mu: float, eps: float) -> mp.mpf:
    mp.mp.dps = 50
    mu_, eps_ = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(-eps_ / mu_ + mu_ / 2) - mp.exp(eps_) * mp.ncdf(-eps_ / mu_ - mu_ / 2)


@pytest.mark.parametrize("mu", [0.05, 0.3, 1.0, 2.5, 8.0])
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0, 5.0, 20.0])
def test_delta_matches_mpmath(mu: float, eps: float) -> None:
    exact = float(_delta_mp(mu, eps))
    assert gdp.delta_of(mu, eps) == pytest.approx(exact, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_epsilon_is_smallest_valid(mu: float, delta: float) -> None:
    eps = gdp.epsilon_of(mu, delta)
    assert float(_delta_mp(mu, eps)) <= delta * (1 + 1e-9)
    assert float(_delta_mp(mu, eps * (1 - 1e-6))) > delta


@pytest.mark.parametrize("mu", [0.2, 1.0, 2.0])
def test_matches_dp_accounting_pld_for_a_unit_gaussian(mu: float) -> None:
    # dp_accounting's Gaussian has sensitivity 1 under add/remove; under REPLACE_ONE it doubles
    # the sensitivity, which is why dprelease passes noise multipliers relative to the
    # replace-one sensitivity and never a bare Gaussian event with REPLACE_ONE.
    acc = dpa.pld.PLDAccountant(
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4
    )
    acc.compose(dpa.GaussianDpEvent(1 / mu))
    pld_eps = acc.get_epsilon(1e-5)
    ours = gdp.epsilon_of(mu, 1e-5)
    assert ours <= pld_eps <= ours + 1e-3  # PLD discretisation is pessimistic


def test_composition_of_gdp_entries_is_exact() -> None:
    one = Cost(epsilon=gdp.epsilon_of(0.5, 1e-5), delta=1e-5, mu=0.5)
    assert compose_epsilon([one] * 4, delta=1e-5) == gdp.epsilon_of(1.0, 1e-5)
    # A GDP entry also carries its RDP curve and joins RDP composition with others.
    assert one.rdp == tuple(a * 0.125 for a in ORDERS)
    other = Cost(epsilon=1.0, delta=1e-6, rdp=tuple(a * 0.01 for a in ORDERS))
    mixed = compose_epsilon([one, other], delta=1e-5)
    assert mixed <= one.epsilon + other.epsilon
    assert mixed >= max(one.epsilon, other.epsilon) - 1e-9


def test_mu_for_epsilon_inverts() -> None:
    mu = gdp.mu_for_epsilon(2.0, 1e-5)
    assert gdp.delta_of(mu, 2.0) <= 1e-5
    assert gdp.delta_of(mu * (1 + 1e-6), 2.0) > 1e-5


@pytest.mark.slow  # property-based (hypothesis)
@settings(max_examples=40, deadline=None)
@given(mu=st.floats(0.01, 20.0), delta=st.floats(1e-12, 0.5))
def test_epsilon_decreases_with_delta_and_grows_with_mu(mu: float, delta: float) -> None:
    assert gdp.epsilon_of(mu, delta) >= gdp.epsilon_of(mu, min(0.9, delta * 2)) - 1e-12
    assert gdp.epsilon_of(mu * 1.1, delta) >= gdp.epsilon_of(mu, delta)


def test_invalid_inputs() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            gdp.delta_of(bad, 1.0)
    with pytest.raises(ValueError):
        gdp.epsilon_of(1.0, 1.0)
    with pytest.raises(ValueError):
        Cost(epsilon=1.0, delta=1e-5, mu=-1.0)
