"""dpcore.accounting.wor_gaussian against dp_accounting's ``_compute_rdp_sample_wor_gaussian``.

The fast implementation must reproduce dp_accounting's values (relative error ≤ 1e-9, the same
inf entries) and must never fall below them: its output feeds the privacy ledger.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accounting.orders import ORDERS
from dpcore.accounting.wor_gaussian import (
    MAX_FINITE_ORDER,
    forward_diff_logs,
    log_moments_int,
    rdp_wor_gaussian,
)

REL_TOL = 1e-9
QS = [1e-6, 1e-4, 64 / 1e6, 0.0064, 0.01, 0.1, 0.5, 0.9, 1.0]
ZS = [0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 20.0, 100.0, 1e3]


def reference(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, orders), dtype=float)


@functools.cache
def reference_on_grid(q: float, z: float) -> np.ndarray:
    return reference(q, z, ORDERS)


def assert_matches(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == np.float64
    assert ours.shape == ref.shape
    assert not np.isnan(ref).any(), "dp_accounting itself returned NaN"
    assert not np.isnan(ours).any()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
    finite = np.isfinite(ref)
    o, r = ours[finite], ref[finite]
    scale = np.abs(r)
    # Within REL_TOL both ways, and in particular never below dp_accounting's bound.
    assert np.all(np.abs(o - r) <= REL_TOL * scale), np.max(
        np.abs(o - r) / np.maximum(scale, 1e-300)
    )
    assert np.all(o >= r - REL_TOL * scale)


@pytest.mark.parametrize("z", ZS)
@pytest.mark.parametrize("q", QS)
def test_matches_dp_accounting_on_the_grid(q: float, z: float) -> None:
    assert_matches(rdp_wor_gaussian(q, z, ORDERS), reference_on_grid(q, z))


@pytest.mark.slow  # property-based (hypothesis)
@settings(max_examples=50, deadline=None)
@given(
    q=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    z=st.floats(min_value=0.3, max_value=1e3),
)
def test_matches_dp_accounting_random(q: float, z: float) -> None:
    assert_matches(rdp_wor_gaussian(q, z, ORDERS), reference(q, z, ORDERS))


def test_off_grid_orders() -> None:
    # Fractional orders straddling max_alpha = 256 (exact at ⌊α⌋, cap-only at ⌈α⌉), above it,
    # and integer orders on the cap-only path.
    orders = (1.5, 2.0, 2.5, 255.5, 256.5, 257.0, 300.25, 2000.0, 2047.5, math.inf)
    for q, z in [(0.01, 1.0), (0.3, 0.4), (0.9, 50.0), (0.2, 1e4)]:
        assert_matches(rdp_wor_gaussian(q, z, orders), reference(q, z, orders))


@pytest.mark.parametrize("z", [1.0, 100.0])
def test_forward_differences_are_bitwise_dp_accountings(z: float) -> None:
    # At z = 100 the high-order differences are rounding noise in dp_accounting, and that noise
    # reaches the RDP; matching it needs the same bits, not just close values.
    def cgf(x: float) -> float:
        return x * 1.0 * (x + 1) / (2.0 * z**2)

    ref, _ = dpa_rdp._get_forward_diffs(cgf, 256)
    np.testing.assert_array_equal(forward_diff_logs(z, 255), ref[:256])


def test_log_moments_int() -> None:
    q, z = 0.05, 2.0
    moments = log_moments_int(q, z, 300)
    assert moments.shape == (301,)
    for alpha in [0, 1, 2, 3, 10, 63, 257, 300]:
        ref = dpa_rdp._compute_rdp_sample_wor_gaussian_int(q, z, alpha)
        assert moments[alpha] == pytest.approx(ref, rel=1e-12, abs=0.0)
    np.testing.assert_array_equal(log_moments_int(0.0, z, 5), np.zeros(6))
    np.testing.assert_array_equal(log_moments_int(q, 0.0, 3), [0.0, 0.0, np.inf, np.inf])


def test_q_zero_is_free() -> None:
    out = rdp_wor_gaussian(0.0, 1.0, [1.0, 2.5, 1024.0, math.inf])
    np.testing.assert_array_equal(out, np.zeros(4))
    np.testing.assert_array_equal(rdp_wor_gaussian(0, 0.0, [2.0]), [0.0])


def test_q_one_is_the_plain_gaussian() -> None:
    orders = [1.0, 1.5, 2.0, 1024.0, math.inf]
    out = rdp_wor_gaussian(1.0, 2.0, orders)
    np.testing.assert_array_equal(out, [1 / 8, 1.5 / 8, 2 / 8, 128.0, math.inf])
    np.testing.assert_array_equal(out, reference(1.0, 2.0, tuple(orders)))


def test_no_noise_is_infinite() -> None:
    # dp_accounting divides by σ² = 0 here (ZeroDivisionError); inf is the only safe answer.
    np.testing.assert_array_equal(rdp_wor_gaussian(0.5, 0.0, [1.5, 2.0]), [np.inf, np.inf])
    np.testing.assert_array_equal(rdp_wor_gaussian(1.0, 0.0, [2.0]), [np.inf])
    np.testing.assert_array_equal(rdp_wor_gaussian(0.5, 1e-170, [2.0]), [np.inf])


def test_infinite_order() -> None:
    out = rdp_wor_gaussian(0.01, 1.0, [2.0, math.inf])
    assert math.isfinite(out[0])
    assert out[1] == math.inf


def test_order_one_is_the_limit_from_above() -> None:
    # dp_accounting divides log A_1 = 0 by α − 1 = 0 (ZeroDivisionError). Its curve is constant
    # on (1, 2), equal to the value at 2; that limit is what order 1 gets.
    q, z = 0.01, 1.0
    out = rdp_wor_gaussian(q, z, [1.0, 1.5, 2.0])
    assert out[0] == out[2]
    assert out[1] == pytest.approx(out[2], rel=1e-15)
    with pytest.raises(ZeroDivisionError):
        dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, [1.0])


def test_accepts_sequences_and_arrays() -> None:
    as_tuple = rdp_wor_gaussian(0.1, 1.0, (2, 3, 4.5))
    as_array = rdp_wor_gaussian(np.float64(0.1), np.float64(1.0), np.array([2.0, 3.0, 4.5]))
    np.testing.assert_array_equal(as_tuple, as_array)
    assert rdp_wor_gaussian(0.1, 1.0, []).shape == (0,)


@pytest.mark.parametrize(
    ("q", "z", "orders"),
    [
        (-0.1, 1.0, [2.0]),
        (1.5, 1.0, [2.0]),
        (math.nan, 1.0, [2.0]),
        (0.1, -1.0, [2.0]),
        (0.1, math.nan, [2.0]),
        (0.1, math.inf, [2.0]),
        (0.1, 1.0, [0.5]),
        (0.1, 1.0, [2.0, math.nan]),
        (0.1, 1.0, [-math.inf]),
        (0.1, 1.0, [[2.0, 3.0]]),
        (0.1, 1.0, [MAX_FINITE_ORDER + 1.0]),
    ],
)
def test_rejects_bad_input(q: float, z: float, orders: list[float]) -> None:
    with pytest.raises(ValueError):
        rdp_wor_gaussian(q, z, orders)


@pytest.mark.parametrize("max_order", [-1, 2.5, MAX_FINITE_ORDER + 1])
def test_log_moments_int_rejects_bad_order(max_order: int) -> None:
    with pytest.raises(ValueError):
        log_moments_int(0.1, 1.0, max_order)
