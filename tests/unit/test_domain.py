"""dpcore.domain: released rows mapped into the declared domain (post-processing)."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.domain import into_domain, sample_categories


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
