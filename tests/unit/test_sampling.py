"""dpcore.mechanisms.sampling.uniform_subsets: exactly the sampling the accountant assumes.

Each row must be a uniformly random ℓ-subset of range(n), independently of every other row,
in both regimes: rejection and smallest-keys (with boundary ties redrawn).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms.sampling import acceptance, uniform_subsets, uses_rejection
from dpcore.mechanisms.secure_random import SecureRandom

CPU = torch.device("cpu")
DRAWS = 50_000

# (n, ℓ): rejection regime and key regime
REGIMES = [(20, 3), (9, 3), (6, 4), (10, 4)]


def draw(n: int, size: int, count: int = DRAWS, seed: int = 1234) -> np.ndarray:
    out = uniform_subsets(n, size, count, generator=SecureRandom.from_seed(seed), device=CPU)
    assert out.shape == (count, size)
    assert out.dtype == torch.int64
    return out.numpy()


def indicators(rows: np.ndarray, n: int) -> np.ndarray:
    ind = np.zeros((rows.shape[0], n), dtype=np.float64)
    np.put_along_axis(ind, rows, 1.0, axis=1)
    return ind


def test_regimes_cover_both_branches() -> None:
    assert any(uses_rejection(n, size) for n, size in REGIMES)
    assert any(not uses_rejection(n, size) for n, size in REGIMES)


def test_regime_choice_at_mnist_sizes() -> None:
    # n = 60000: ℓ = 256 is accepted with probability ≈ 0.58, far cheaper than 60000 keys
    assert acceptance(60_000, 1) == 1.0
    assert acceptance(60_000, 256) == pytest.approx(math.exp(-256 * 255 / 120_000), rel=1e-2)
    assert uses_rejection(60_000, 256)
    assert not uses_rejection(60_000, 2048)


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
    generator = SecureRandom.from_seed(0)
    with pytest.raises(ValueError):
        uniform_subsets(n, size, 3, generator=generator, device=CPU)


class _TinyKeys(SecureRandom):
    """Sort keys from {0, 1, 2} only: boundary ties in most rows."""

    def keys(self, shape: tuple[int, ...], *, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.randint(3, shape, device=device).to(torch.int32)


def test_key_path_exactly_uniform_under_frequent_ties() -> None:
    # Without the redraw, topk breaks ties by position and favours small indices: this
    # chi-square then fails by far (p < 1e-100); with it, every 2-subset of 5 is equally likely.
    n, size = 5, 2
    assert not uses_rejection(n, size)
    rows = uniform_subsets(n, size, DRAWS, generator=_TinyKeys.from_seed(3), device=CPU).numpy()
    assert (np.diff(np.sort(rows, axis=1), axis=1) > 0).all()
    index = {s: i for i, s in enumerate(itertools.combinations(range(n), size))}
    counts = np.bincount([index[tuple(sorted(r))] for r in rows.tolist()], minlength=len(index))
    assert stats.chisquare(counts).pvalue > 1e-4


class _ScriptedKeys(SecureRandom):
    """Returns the given key tables in turn and records the shapes asked for."""

    def __init__(self, tables: list[list[list[int]]]) -> None:
        super().__init__(key=bytes(32))
        self.tables = tables
        self.shapes: list[tuple[int, ...]] = []

    def keys(self, shape: tuple[int, ...], *, device: torch.device | str = "cpu") -> torch.Tensor:
        self.shapes.append(tuple(shape))
        return torch.tensor(self.tables.pop(0), dtype=torch.int32)


def test_forced_boundary_tie_is_redrawn() -> None:
    # Row 0 ties at the boundary (3rd and 4th smallest keys both 7): it alone is redrawn.
    source = _ScriptedKeys(
        [
            [[1, 7, 9, 7, 0, 8], [5, 4, 3, 2, 1, 0]],
            [[9, 8, 0, 1, 2, 7]],
        ]
    )
    out = uniform_subsets(6, 3, 2, generator=source, device=CPU)
    assert source.shapes == [(2, 6), (1, 6)]
    assert sorted(out[0].tolist()) == [2, 3, 4]
    assert sorted(out[1].tolist()) == [3, 4, 5]


def test_tie_inside_the_subset_is_kept() -> None:
    source = _ScriptedKeys([[[1, 1, 5, 9, 7, 8]]])
    out = uniform_subsets(6, 3, 1, generator=source, device=CPU)
    assert source.shapes == [(1, 6)]
    assert sorted(out[0].tolist()) == [0, 1, 2]
