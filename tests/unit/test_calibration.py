"""dpcore.calibration.smallest_noise and dpcore.accounting.dpmix.calibrate: never overshoot.

Synthetic monotone ε-curves with a known threshold check the search itself; a few random
DPMix settings check the real calibration (ε ≤ target, and a slightly smaller σ misses it).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.calibration import CalibrationError, smallest_noise
from dpcore.mechanisms.dpmix.accounting import DPMixEvent, calibrate

RTOL = 1e-6
# c/σ in floating point can sit on the target one ulp below the exact threshold c/target.
ULP_SLACK = 1e-14


@pytest.mark.parametrize("initial", [1e-6, 0.01, 1.0, 7.0, 1.2e4, 1e8])
@pytest.mark.parametrize(("c", "target"), [(1.0, 1.0), (3.0, 0.7), (0.02, 5.0), (250.0, 0.1)])
def test_inverse_curve_threshold(c: float, target: float, initial: float) -> None:
    threshold = c / target
    calls: list[float] = []

    def eps(sigma: float) -> float:
        calls.append(sigma)
        return c / sigma

    sigma, reported = smallest_noise(eps, target, initial=initial, rtol=RTOL)
    assert reported == c / sigma
    assert reported <= target
    assert sigma >= threshold * (1 - ULP_SLACK)
    assert sigma <= threshold * (1 + RTOL)
    assert len(calls) < 200  # cached and bracketed, not a scan


@pytest.mark.parametrize("rtol", [1e-3, 1e-8])
def test_rtol_is_honoured(rtol: float) -> None:
    # A convex, steep curve: ε = (2/σ)³, threshold at 2·target^(−1/3).
    target = 0.3
    threshold = 2 * target ** (-1 / 3)
    sigma, reported = smallest_noise(lambda s: (2 / s) ** 3, target, rtol=rtol)
    assert reported <= target
    assert threshold * (1 - ULP_SLACK) <= sigma <= threshold * (1 + rtol)


def test_step_function() -> None:
    # Discontinuous but monotone: the answer is the jump at σ = 1.
    def eps(s: float) -> float:
        return 2.0 if s < 1 else 0.5

    for initial in (1e-3, 0.99, 1.0, 50.0):
        sigma, reported = smallest_noise(eps, 1.0, initial=initial, rtol=RTOL)
        assert reported == 0.5
        assert 1.0 <= sigma <= 1.0 + 2 * RTOL


@pytest.mark.slow  # property-based (hypothesis)
@settings(max_examples=200, deadline=None)
@given(
    c=st.floats(1e-3, 1e3),
    target=st.floats(1e-2, 1e2),
    initial=st.floats(1e-4, 1e4),
    power=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_never_overshoots_property(c: float, target: float, initial: float, power: float) -> None:
    def eps(s: float) -> float:
        return (c / s) ** power

    threshold = c / target ** (1 / power)
    sigma, reported = smallest_noise(eps, target, initial=initial, rtol=RTOL)
    assert reported == eps(sigma)
    assert reported <= target
    assert threshold * (1 - ULP_SLACK) <= sigma <= threshold * (1 + RTOL)


def test_unreachable_raises() -> None:
    with pytest.raises(CalibrationError):
        smallest_noise(lambda s: 1.0 + 1.0 / s, 0.5)
    with pytest.raises(CalibrationError):
        smallest_noise(lambda s: 1e9 / s, 1e-6, max_sigma=1e12)


@pytest.mark.parametrize("target", [0.0, -1.0, math.inf, math.nan])
def test_bad_target_raises(target: float) -> None:
    with pytest.raises(CalibrationError):
        smallest_noise(lambda s: 1 / s, target)


def test_calibration_error_is_value_error() -> None:
    assert issubclass(CalibrationError, ValueError)


@pytest.mark.parametrize(
    ("c", "power", "target", "initial"),
    [
        # upper end: hi = 2500, ε(2500) = 0.1 exactly, 250 / exp(log 2500) = 0.1 + 2e-17
        (250.0, 1.0, 0.1, 10_000.0),
        # lower end (found by hypothesis): ε(0.01) = 0.01 + 2e-18 > target, but
        # exp(log 0.01) = 0.010000000000000004 gives 0.009999999999999993 < target
        (0.001, 2.0, 0.01, 0.01),
    ],
)
def test_threshold_on_bracket_end(c: float, power: float, target: float, initial: float) -> None:
    def eps(s: float) -> float:
        return (c / s) ** power

    try:
        sigma, reported = smallest_noise(eps, target, initial=initial, rtol=RTOL)
    except ValueError as exc:
        raise AssertionError(f"smallest_noise crashed: {exc}") from exc
    assert reported <= target
    assert sigma == pytest.approx(c / target ** (1 / power), rel=RTOL)


def test_threshold_just_below_max_sigma_is_found() -> None:
    # From initial = 1 the bracket visits 4^19 ≈ 2.7e11 (ε > 1), then 4^20 ≈ 1.1e12 > 1e12.
    sigma, _ = smallest_noise(lambda s: 5e11 / s, 1.0, max_sigma=1e12)
    assert sigma == pytest.approx(5e11, rel=RTOL)


def test_flat_at_target_returns_smallest() -> None:
    def eps(s: float) -> float:
        return 2.0 / s if s < 1 else (1.0 if s < 10 else 0.5)

    sigma, _ = smallest_noise(eps, 1.0, initial=100.0, rtol=RTOL)
    assert sigma == pytest.approx(1.0, rel=RTOL)


def test_tiny_threshold_within_rtol() -> None:
    sigma, reported = smallest_noise(lambda s: 1e-13 / s, 1.0, rtol=RTOL)
    assert reported <= 1.0
    assert sigma == pytest.approx(1e-13, rel=RTOL)


@pytest.mark.parametrize("initial", [1e-300, 1e250])
def test_far_guess_costs_few_evaluations(initial: float) -> None:
    # The crossing is hundreds of factors of 4 from the guess: galloping finds it in a few
    # dozen evaluations, where fixed steps took ~500.
    calls: list[float] = []

    def eps(sigma: float) -> float:
        calls.append(sigma)
        return 3.0 / sigma

    sigma, reported = smallest_noise(eps, 1.0, initial=initial, rtol=RTOL, max_sigma=1e300)
    assert reported <= 1.0 and sigma == pytest.approx(3.0, rel=RTOL)
    assert len(calls) <= 80


def test_infinite_below_a_floor() -> None:
    # Accountants answer ε = ∞ below a noise floor (here σ < 0.013); a target above every
    # finite ε ends on that floor, quickly and never below it.
    calls: list[float] = []

    def eps(sigma: float) -> float:
        calls.append(sigma)
        return math.inf if sigma < 0.013 else 1.0 / sigma

    for target in (1e300, 1e6, 50.0):
        calls.clear()
        sigma, reported = smallest_noise(eps, target, initial=1e-290, rtol=RTOL)
        assert math.isfinite(reported) and reported <= target
        assert sigma == pytest.approx(max(0.013, 1 / target), rel=RTOL)
        assert len(calls) <= 80


# --- DPMix calibration ----------------------------------------------------------------------


@pytest.mark.slow  # property-based (hypothesis)
@settings(max_examples=4, deadline=None)
@given(
    n=st.integers(200, 20_000),
    ell=st.integers(2, 32),
    T=st.integers(1, 2_000),
    target=st.floats(0.3, 8.0),
    delta=st.sampled_from([1e-5, 1e-6]),
)
def test_dpmix_calibrate_never_overshoots(
    n: int, ell: int, T: int, target: float, delta: float
) -> None:
    event = calibrate(n=n, mixture_degree=ell, n_samples=T, epsilon=target, delta=delta)
    assert (event.n, event.mixture_degree, event.n_samples) == (n, ell, T)
    assert event.epsilon(delta) <= target
    # smallest up to the tolerance: a hair less noise misses the target
    smaller = event.sigma_x * (1 - 1e-5)
    assert DPMixEvent(n, ell, T, smaller, smaller).epsilon(delta) > target


def test_dpmix_calibrate_with_noise_ratio_is_tight() -> None:
    event = calibrate(
        n=5_000, mixture_degree=16, n_samples=500, epsilon=1.5, delta=1e-5, noise_ratio=0.5
    )
    assert event.sigma_y == pytest.approx(0.5 * event.sigma_x, rel=1e-15)
    assert event.epsilon(1e-5) <= 1.5
    s = event.sigma_x * (1 - 1e-5)
    assert DPMixEvent(5_000, 16, 500, s, 0.5 * s).epsilon(1e-5) > 1.5
