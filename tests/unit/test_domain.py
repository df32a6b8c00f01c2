"""dpcore.domain: released rows mapped into the declared domain (post-processing)."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.domain import MissingIndicator, into_domain, missing_indicators, sample_categories


def test_values_are_clipped_column_by_column_in_their_dtype() -> None:
    X = np.array([[-5.0, 0.5, 300.0], [2.0, 9.0, -1.0]], dtype=np.float32)
    out = into_domain(X, np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 255.0]), (), _rng())
    assert out.dtype == np.float32
    assert np.array_equal(out, np.array([[0.0, 0.5, 255.0], [1.0, 1.0, 0.0]], np.float32))
    assert np.array_equal(X[0], np.array([-5.0, 0.5, 300.0], np.float32))  # not in place


def test_a_block_becomes_one_category_drawn_with_the_rows_proportions() -> None:
    n = 40_000
    # Proportions of the drawn block: negatives to 0, then scaled to sum to 1; values above
    # the one-hot bound count as drawn (3 : 1), not clipped first (1 : 1).
    rows = np.tile([0.4, -0.5, 1.2, 0.4, 7.0, 3.0, 1.0], (n, 1))
    out = into_domain(
        rows, np.zeros(7), np.array([1, 1, 1, 1, 10, 10, 10.0]), [(0, 1, 2, 3), (5, 6)], _rng()
    )
    block = out[:, :4]
    assert set(np.unique(block)) == {0.0, 1.0} and (block.sum(axis=1) == 1).all()
    freq = block.mean(axis=0)
    assert freq[1] == 0  # a category with no positive mass is never drawn
    assert freq == pytest.approx([0.2, 0.0, 0.6, 0.2], abs=0.01)  # ≥ 4 sd at n = 40 000
    assert out[:, 5].mean() == pytest.approx(0.75, abs=0.01)
    assert (out[:, 4] == 7.0).all()  # a numeric column between the blocks is left alone


def test_a_block_with_nothing_positive_draws_uniformly() -> None:
    out = sample_categories(np.full((30_000, 3), -1.0), [(0, 1, 2)], _rng())
    assert out.mean(axis=0) == pytest.approx([1 / 3] * 3, abs=0.012)


def test_bounds_must_match_the_rows() -> None:
    with pytest.raises(ValueError, match="width 2 against 3"):
        into_domain(np.zeros((1, 2)), np.zeros(3), np.ones(3), (), _rng())


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


DECLARED = [
    {"name": "age", "type": "numeric", "bounds": [0, 100], "missing": {"policy": "indicator"}},
    {"name": "dose", "type": "numeric", "bounds": [0, 10]},
    {
        "name": "ward",
        "type": "categorical",
        "categories": ["A", "B", "C"],
        "missing": {"policy": "indicator", "fill": "B"},
    },
    {
        "name": "sex",
        "type": "categorical",
        "categories": ["F", "M"],
        "missing": {"policy": "indicator"},
    },
]


def test_missing_indicators_name_their_columns_and_the_uploads_fill() -> None:
    # Features: age, age_missing, dose, ward=A, ward=B, ward=C, ward_missing, sex=F, sex=M,
    # sex_missing (categorical.encoded_names).
    rules = missing_indicators(DECLARED)
    assert rules == (
        MissingIndicator(1, (0,), (50.0,)),  # no fill: the middle of the bounds
        MissingIndicator(6, (3, 4, 5), (0.0, 1.0, 0.0)),  # the declared fill category
        MissingIndicator(9, (7, 8), (0.0, 0.0)),  # no fill: no category
    )


def test_an_indicator_is_drawn_with_its_value_and_a_missing_entry_holds_the_fill() -> None:
    n = 40_000
    lo = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.float64)
    hi = np.array([100, 1, 10, 1, 1, 1, 1, 1, 1, 1], dtype=np.float64)
    row = [70.0, 0.3, 12.0, 0.2, 0.2, 0.6, 1.7, 0.5, 0.5, -0.4]
    out = into_domain(
        np.tile(row, (n, 1)), lo, hi, [(3, 4, 5), (7, 8)], _rng(), missing_indicators(DECLARED)
    )
    age_gap, ward_gap = out[:, 1] == 1, out[:, 6] == 1
    assert set(np.unique(out[:, [1, 6, 9]])) <= {0.0, 1.0}
    assert age_gap.mean() == pytest.approx(0.3, abs=0.01)  # its value as the probability
    assert ward_gap.all() and not (out[:, 9] == 1).any()  # clipped to 1 and to 0 first
    assert (out[age_gap, 0] == 50).all() and (out[~age_gap, 0] == 70).all()
    assert (out[:, 3:6] == [0, 1, 0]).all()  # every ward missing: the declared fill B
    assert (out[:, 2] == 10).all()  # a column without a policy is only clipped
    sex = out[:, 7:9]
    assert (sex.sum(axis=1) == 1).all()  # not missing: one category drawn
