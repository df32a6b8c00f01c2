"""DPMix `paper` accountant (Lee et al. Thm 1 and Thm 3) and the tight record variant."""

from __future__ import annotations

import functools
import math

import mpmath as mp
import numpy as np
import pytest

from dpcore.accounting import Cost, compose_epsilon, gdp
from dpcore.accounting.orders import ORDERS, epsilon_from_rdp
from dpcore.mechanisms import registry
from dpcore.mechanisms.dpmix.accounting import DPMixRecordEvent
from dpcore.mechanisms.dpmix.accounting_paper import DPMixPaperEvent
from dpcore.mechanisms.dpmix.accounting_pld import DPMixPLDEvent


@functools.cache
def _theorem1_B(c: mp.mpf, k: int) -> mp.mpf:
    """B(k) of Theorem 1 at c, at the precision _theorem1_mp sets (each (c, k) is summed once:
    the orders a test asks for share their terms)."""
    return mp.fsum((-1) ** i * mp.binomial(k, i) * mp.e ** (i * (i - 1) * c) for i in range(k + 1))


def _theorem1_mp(n: int, ell: int, T: int, sx: float, sy: float, dx: int, dy: int, alpha: int):  # type: ignore[no-untyped-def]
    """T·ε′_α of Theorem 1, term by term in 120-digit arithmetic (independent of dprelease)."""
    mp.mp.dps = 400  # B(k) cancels massively for large k
    p = mp.mpf(ell) / n
    c = (mp.mpf(dx) / sx**2 + mp.mpf(dy) / sy**2) / (2 * ell**2)

    def B(k: int) -> mp.mpf:
        return _theorem1_B(c, k)

    G = mp.fsum(
        p**j * mp.binomial(alpha, j) * mp.sqrt(B(2 * (j // 2)) * B(2 * ((j + 1) // 2)))
        for j in range(3, alpha + 1)
    )
    inner = (
        1
        + p**2 * mp.binomial(alpha, 2) * min(4 * (mp.e ** (2 * c) - 1), 2 * mp.e ** (2 * c))
        + 4 * G
    )
    return T * mp.log(inner) / (alpha - 1)


CASES = [
    (1000, 10, 100, 2.0, 2.0, 20, 5),
    (500, 4, 50, 3.0, 1.5, 30, 3),
    (10_000, 64, 1000, 0.5, 0.5, 784, 10),
]


@pytest.mark.parametrize("case", CASES)
def test_theorem1_curve_matches_mpmath(case: tuple) -> None:  # type: ignore[type-arg]
    event = DPMixPaperEvent(*case)
    curve = event._theorem1_curve()
    for alpha in (2, 3, 5, 8, 13, 21, 30):
        assert curve[alpha - 2] == pytest.approx(float(_theorem1_mp(*case, alpha)), rel=1e-9)


@pytest.mark.slow  # 4-7 s: kept out of make test-fast
def test_theorem1_epsilon_is_the_min_over_integer_orders() -> None:
    event = DPMixPaperEvent(*CASES[0])
    alphas = np.arange(2, 257)
    per_order = event._theorem1_curve() + math.log(1e5) / (alphas - 1)
    best = int(alphas[np.argmin(per_order)])
    assert event.epsilon(1e-5) == float(per_order.min())

    def eps_at(alpha: int) -> float:
        return float(_theorem1_mp(*CASES[0], alpha)) + math.log(1e5) / (alpha - 1)

    # The reported ε is the paper's expression at the best order, evaluated independently…
    assert event.epsilon(1e-5) == pytest.approx(eps_at(best), rel=1e-9)
    # …and no other order gives less.
    for alpha in sorted({2, 10, 40, best - 1, best + 1, 150}):
        assert eps_at(alpha) >= event.epsilon(1e-5) * (1 - 1e-9)


def test_theorem3_closed_form() -> None:
    n, ell, T, s, dx, dy, delta = 10_000, 64, 10_000, 1.0, 784, 10, 1e-5
    event = DPMixPaperEvent(n, ell, T, s, s, dx, dy, "record")
    tp, d2 = T * ell / n, dx / s**2 + dy / s**2
    alpha = 1 + math.sqrt(2 * ell**2 * math.log(1 / delta) / (tp * d2))
    expected = alpha * tp * d2 / (2 * ell**2) + math.log(1 / delta) / (alpha - 1)
    assert event.epsilon(delta) == pytest.approx(expected, rel=1e-12)


def test_paper_is_looser_than_tight_for_mnist() -> None:
    keys = {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "d_x": 784, "d_y": 10}
    paper = registry.accountant("dpmix", "paper").calibrate(10, 1e-5, keys)
    tight = registry.accountant("dpmix", "tight").calibrate(10, 1e-5, keys)
    assert paper.epsilon(1e-5) <= 10 and tight.epsilon(1e-5) <= 10
    assert paper.noise().sigma_x > 10 * tight.noise().sigma_x


def test_paper_rdp_curve_is_an_upper_bound_on_the_grid() -> None:
    event = DPMixPaperEvent(*CASES[0])
    curve = event.rdp()
    integer = event._theorem1_curve()
    for order, value in zip(ORDERS, curve, strict=True):
        if float(order).is_integer() and 2 <= order <= 256:
            assert value == pytest.approx(integer[int(order) - 2], rel=1e-12)
        if order > 256:
            assert value == math.inf
    # Converting the stored curve is never worse than the paper's own conversion.
    assert epsilon_from_rdp(curve, delta=1e-5) <= event.epsilon(1e-5) + 1e-9
    cost = event.cost(1e-5)
    assert compose_epsilon([cost], delta=1e-5) <= cost.epsilon


def test_tight_record_variant_is_gdp() -> None:
    event = DPMixRecordEvent(10_000, 64, 10_000, 0.05, 0.1)
    k = math.ceil(10_000 * 64 / 10_000)
    mu = math.sqrt(k * (2 / (64**2 * 0.05**2) + 2 / (64**2 * 0.1**2)))
    assert event.mixtures_per_record == k and event.mu == pytest.approx(mu, rel=1e-14)
    assert event.epsilon(1e-5) == gdp.epsilon_of(mu, 1e-5)
    cost = event.cost(1e-5)
    assert isinstance(cost, Cost) and cost.mu == event.mu
    via_registry = registry.accountant("dpmix", "tight").at_sigma(
        0.05,
        {
            "n": 10_000,
            "mixture_degree": 64,
            "n_samples": 10_000,
            "sigma_y": 0.1,
            "assignment": "record",
        },
    )
    assert via_registry.epsilon(1e-5) == event.epsilon(1e-5)
    # The mixture variant is a different event.
    assert registry.accountant("dpmix", "tight").at_sigma(
        0.05, {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "sigma_y": 0.1}
    ) == DPMixPLDEvent(10_000, 64, 10_000, 0.05, 0.1)


def test_paper_needs_dimensions_and_valid_assignment() -> None:
    paper = registry.accountant("dpmix", "paper")
    with pytest.raises(ValueError, match="d_x"):
        paper.at_sigma(1.0, {"n": 100, "mixture_degree": 4, "n_samples": 10, "d_y": 2})
    with pytest.raises(ValueError, match="assignment"):
        paper.at_sigma(
            1.0,
            {"n": 100, "mixture_degree": 4, "n_samples": 10, "d_x": 3, "d_y": 2, "assignment": "x"},
        )
