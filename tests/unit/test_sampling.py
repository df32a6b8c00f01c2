"""dpcore.mechanisms.sampling.uniform_subsets: exactly the sampling the accountant assumes.

Each row must be a uniformly random ℓ-subset of range(n), independently of every other row,
in both regimes: rejection (ℓ² ≤ n) and smallest-keys (ℓ² > n).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms.sampling import uniform_subsets

CPU = torch.device("cpu")
DRAWS = 50_000

# (n, ℓ): rejection regime (incl. the boundary ℓ² = n) and key regime
REGIMES = [(20, 3), (9, 3), (6, 4), (10, 4)]


def draw(n: int, size: int, count: int = DRAWS, seed: int = 1234) -> np.ndarray:
    generator = torch.Generator(device=CPU)
    generator.manual_seed(seed)
    out = uniform_subsets(n, size, count, generator=generator, device=CPU)
    assert out.shape == (count, size)
    assert out.dtype == torch.int64
    return out.numpy()


def indicators(rows: np.ndarray, n: int) -> np.ndarray:
    ind = np.zeros((rows.shape[0], n), dtype=np.float64)
    np.put_along_axis(ind, rows, 1.0, axis=1)
    return ind


def test_regimes_cover_both_branches() -> None:
    assert any(size * size <= n for n, size in REGIMES)
    assert any(size * size > n for n, size in REGIMES)


@pytest.mark.parametrize(("n", "size"), [*REGIMES, (1, 1), (5, 5), (100, 1), (1000, 31)])
def test_rows_are_distinct_and_in_range(n: int, size: int) -> None:
    rows = draw(n, size, count=2_000)
    assert rows.min() >= 0
    assert rows.max() < n
    ordered = np.sort(rows, axis=1)
    assert (np.diff(ordered, axis=1) > 0).all()


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_subsets_uniform_chi_square(n: int, size: int) -> None:
    rows = draw(n, size)
    index = {s: i for i, s in enumerate(itertools.combinations(range(n), size))}
    assert len(index) == math.comb(n, size)
    codes = np.array([index[tuple(sorted(r))] for r in rows.tolist()])
    counts = np.bincount(codes, minlength=len(index))
    assert DRAWS / len(index) >= 20  # enough per cell for the chi-square approximation
    assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_each_position_uniform(n: int, size: int) -> None:
    rows = draw(n, size, seed=99)
    for position in range(size):
        counts = np.bincount(rows[:, position], minlength=n)
        assert stats.chisquare(counts).pvalue > 1e-4, f"position {position}"


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_pair_inclusion_frequencies(n: int, size: int) -> None:
    rows = draw(n, size, seed=7)
    ind = indicators(rows, n)
    single = size / n
    pair = size * (size - 1) / (n * (n - 1))
    freq1 = ind.mean(axis=0)
    z1 = (freq1 - single) / math.sqrt(single * (1 - single) / DRAWS)
    assert np.abs(z1).max() < 5
    co = (ind.T @ ind) / DRAWS
    a, b = np.triu_indices(n, k=1)
    z2 = (co[a, b] - pair) / math.sqrt(pair * (1 - pair) / DRAWS)
    assert np.abs(z2).max() < 5


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_rows_are_independent(n: int, size: int) -> None:
    rows = draw(n, size, seed=2024)
    ind = indicators(rows, n)
    for lag in (1, 2):
        first, second = ind[:-lag], ind[lag:]
        for element in range(n):
            r = np.corrcoef(first[:, element], second[:, element])[0, 1]
            assert abs(r) < 5 / math.sqrt(DRAWS), f"element {element}, lag {lag}"
    # whole-subset repeats between consecutive rows happen at the rate 1/C(n, ℓ)
    same = (np.sort(rows[1:], axis=1) == np.sort(rows[:-1], axis=1)).all(axis=1).mean()
    p = 1 / math.comb(n, size)
    assert abs(same - p) < 5 * math.sqrt(p * (1 - p) / DRAWS)


def test_seeded_generator_is_reproducible() -> None:
    assert (draw(20, 3, count=500, seed=5) == draw(20, 3, count=500, seed=5)).all()
    assert (draw(6, 4, count=500, seed=5) == draw(6, 4, count=500, seed=5)).all()
    assert not (draw(20, 3, count=500, seed=5) == draw(20, 3, count=500, seed=6)).all()


def test_zero_count() -> None:
    assert draw(20, 3, count=0).shape == (0, 3)
    assert draw(6, 4, count=0).shape == (0, 4)


@pytest.mark.parametrize(("n", "size"), [(5, 0), (5, 6), (5, -1), (0, 1)])
def test_invalid_size(n: int, size: int) -> None:
    generator = torch.Generator(device=CPU)
    with pytest.raises(ValueError):
        uniform_subsets(n, size, 3, generator=generator, device=CPU)
