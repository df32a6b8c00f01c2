"""dpcore.preprocessing: the facts the DPMix sensitivity (√2 per record) relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpcore.preprocessing import clip_rows_l2, one_hot, scale_to_unit


def max_pairwise_distance(X: np.ndarray) -> float:
    sq = (X * X).sum(axis=1)
    d2 = sq[:, None] + sq[None, :] - 2 * X @ X.T
    return math.sqrt(max(0.0, float(d2.max())))


def test_scale_to_unit_maps_bounds() -> None:
    lo = np.array([0.0, -1.0, 10.0])
    hi = np.array([255.0, 1.0, 20.0])
    X = np.array([lo, hi, [127.5, 0.0, 12.5]])
    out = scale_to_unit(X, lo, hi)
    np.testing.assert_array_equal(out[0], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(out[1], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(out[2], [0.5, 0.5, 0.25], rtol=1e-15)
    assert out.dtype == np.float64


def test_scale_to_unit_clips() -> None:
    lo = np.array([0.0, 0.0])
    hi = np.array([1.0, 2.0])
    out = scale_to_unit(np.array([[-5.0, 3.0], [2.0, -0.1]]), lo, hi)
    np.testing.assert_array_equal(out, [[0.0, 1.0], [1.0, 0.0]])


def test_scale_to_unit_accepts_ints_and_does_not_mutate() -> None:
    X = np.array([[0, 128, 255]], dtype=np.uint8)
    out = scale_to_unit(X, np.zeros(3), np.full(3, 255.0))
    np.testing.assert_allclose(out, [[0.0, 128 / 255, 1.0]])
    np.testing.assert_array_equal(X, [[0, 128, 255]])


def test_clip_rows_l2() -> None:
    X = np.array([[0.3, 0.4], [3.0, 4.0], [0.0, 0.0], [0.6, 0.8], [1e-300, 0.0]])
    out = clip_rows_l2(X)
    np.testing.assert_array_equal(out[0], X[0])  # short row untouched, bit for bit
    np.testing.assert_array_equal(out[2], X[2])  # zero row stays zero (no 0/0)
    np.testing.assert_array_equal(out[4], X[4])
    np.testing.assert_allclose(out[1], [0.6, 0.8], rtol=1e-15)
    assert np.linalg.norm(out[1]) == pytest.approx(1.0, abs=1e-15)
    assert np.linalg.norm(out[3]) == pytest.approx(1.0, abs=1e-15)


def test_clip_rows_l2_other_norm() -> None:
    X = np.array([[6.0, 8.0], [1.0, 1.0]])
    out = clip_rows_l2(X, max_norm=5.0)
    np.testing.assert_allclose(out, [[3.0, 4.0], [1.0, 1.0]], rtol=1e-15)


def test_long_rows_scaled_to_exactly_unit_norm() -> None:
    rng = np.random.default_rng(1)
    X = rng.random((2_000, 50)) * 10
    norms = np.linalg.norm(clip_rows_l2(X), axis=1)
    np.testing.assert_allclose(norms, 1.0, rtol=0, atol=4e-16)
    # direction preserved
    np.testing.assert_allclose(clip_rows_l2(X) * np.linalg.norm(X, axis=1, keepdims=True), X)


@pytest.mark.slow  # property-based (hypothesis)
@settings(max_examples=60, deadline=None)
@given(
    raw=hnp.arrays(
        np.float64,
        st.tuples(st.integers(2, 12), st.integers(1, 20)),
        elements=st.floats(-50, 300, allow_nan=False),
    )
)
def test_sensitivity_sqrt2_after_preprocessing(raw: np.ndarray) -> None:
    d = raw.shape[1]
    lo = np.full(d, 0.0)
    hi = np.full(d, 255.0)
    X = clip_rows_l2(scale_to_unit(raw, lo, hi))
    assert X.min() >= 0.0
    assert X.max() <= 1.0
    assert np.linalg.norm(X, axis=1).max() <= 1.0 + 1e-15
    assert max_pairwise_distance(X) <= math.sqrt(2) + 1e-12


def test_sensitivity_random_rows() -> None:
    rng = np.random.default_rng(7)
    for d in (1, 2, 10, 784):
        raw = rng.random((300, d)) ** 4 * 300 - 20  # many small, some clipped, some long
        X = clip_rows_l2(scale_to_unit(raw, np.zeros(d), np.full(d, 255.0)))
        assert max_pairwise_distance(X) <= math.sqrt(2) + 1e-12


def test_sqrt2_is_attained() -> None:
    # Orthogonal unit rows (disjoint supports) reach the bound: √2 is tight, not 2.
    X = clip_rows_l2(
        scale_to_unit(
            np.array([[255.0, 0.0, 0.0], [0.0, 0.0, 255.0]]), np.zeros(3), np.full(3, 255.0)
        )
    )
    assert max_pairwise_distance(X) == pytest.approx(math.sqrt(2), rel=1e-15)
    Y = clip_rows_l2(
        scale_to_unit(
            np.array([[200.0, 255.0, 0, 0], [0, 0, 30.0, 255.0]]), np.zeros(4), np.full(4, 255.0)
        )
    )
    assert max_pairwise_distance(Y) == pytest.approx(math.sqrt(2), rel=1e-15)


def test_without_nonnegativity_the_bound_would_be_2() -> None:
    # Documents why scaling into [0, 1] matters: unit rows with negative entries reach 2.
    X = clip_rows_l2(np.array([[1.0, 0.0], [-1.0, 0.0]]))
    assert max_pairwise_distance(X) == pytest.approx(2.0)


def test_one_hot() -> None:
    out = one_hot(np.array([2, 0, 1, 2]), 3)
    np.testing.assert_array_equal(out, [[0, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert out.dtype == np.float64
    assert one_hot(np.array([0, 0]), 4).shape == (2, 4)
    assert one_hot(np.zeros(0, dtype=np.int64), 3).shape == (0, 3)
    # label sensitivity √2: two different one-hot rows are √2 apart
    rows = one_hot(np.arange(5), 5)
    assert max_pairwise_distance(rows) == pytest.approx(math.sqrt(2), rel=1e-15)


def test_one_hot_out_of_range() -> None:
    with pytest.raises(IndexError):
        one_hot(np.array([0, 3]), 3)
