"""dpcore.accounting.pld.epsilon_for_delta: dp_accounting's ε-for-δ scan, vectorised."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpcore.accounting import pld


@pytest.mark.parametrize(
    ("p", "z", "steps"),
    [
        (64 / 10**6, 0.974, 10**5),
        (64 / 10**4, 1.97, 10**4),
        (8 / 10**4, 0.51, 10**4),
        (1.0, 1.0, 4),
    ],
)
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-7, 1e-12])
def test_same_answer_as_the_library(p: float, z: float, steps: int, delta: float) -> None:
    composed = pld.composed_pld(p, z, steps, 1e-5)
    expected = composed.get_epsilon_for_delta(delta)
    got = pld.epsilon_for_delta(composed, delta)
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-13, abs=1e-15)


@pytest.mark.parametrize("delta", [0.5, 1e-2, 1e-6, 1e-300])
def test_asymmetric_and_edge_cases(delta: float) -> None:
    for mechanism in (
        pld_lib.from_gaussian_mechanism(1.3, sensitivity=1.0),
        pld_lib.from_laplace_mechanism(0.7, value_discretization_interval=1e-3),
        pld_lib.from_gaussian_mechanism(30.0, sampling_prob=0.01),
    ):
        expected = mechanism.get_epsilon_for_delta(delta)
        got = pld.epsilon_for_delta(mechanism, delta)
        assert got == pytest.approx(expected, rel=1e-13, abs=1e-15) or (
            math.isinf(got) and math.isinf(expected)
        )
