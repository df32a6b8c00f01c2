"""dpcore.mechanisms.sampling.uniform_subsets: exactly the sampling the accountant assumes.

Each row must be a uniformly random ℓ-subset of range(n), independently of every other row,
on each of its three paths, each forced on the same small (n, ℓ) grid (``subset_path``
patched): distinct draws (draws with replacement, repeated positions redrawn), the complement
of distinct draws, and the ℓ smallest of n keys (boundary ties redrawn); plus the natural
choice of path. ``gather_sum`` and its rounding bound are pinned at the end.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from bench.former_sampling import acceptance, uses_rejection
from dpcore.mechanisms import float_error, sampling
from dpcore.mechanisms.sampling import (
    _by_keys,
    distinct_draws,
    gather_sum,
    gather_sum_error,
    subset_path,
    uniform_subsets,
)
from dpcore.mechanisms.secure_random import SecureRandom

CPU = torch.device("cpu")
DRAWS = 50_000

# (n, ℓ): ℓ = 1, small, n/2 and just under, just over, close to n, n − 1; every path is
# forced on each. ℓ = n has one subset: tested on its own.
REGIMES = [(20, 3), (9, 3), (10, 4), (8, 1), (7, 3), (10, 5), (6, 4), (7, 4), (6, 5), (8, 7)]
PATHS = ["distinct", "complement", "keys"]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Forces ``uniform_subsets`` onto one path for the test."""
    monkeypatch.setattr(sampling, "subset_path", lambda n, size: request.param)
    return str(request.param)


def draw(n: int, size: int, count: int = DRAWS, seed: int = 1234) -> np.ndarray:
    out = uniform_subsets(n, size, count, generator=SecureRandom.from_seed(seed), device=CPU)
    assert out.shape == (count, size)
    assert out.dtype == torch.int64
    return out.numpy()


def indicators(rows: np.ndarray, n: int) -> np.ndarray:
    ind = np.zeros((rows.shape[0], n), dtype=np.float64)
    np.put_along_axis(ind, rows, 1.0, axis=1)
    return ind


def test_natural_path_by_public_sizes() -> None:
    assert subset_path(60_000, 256) == "distinct"
    assert subset_path(60_000, 7_500) == "distinct"  # 8ℓ = n
    assert subset_path(60_000, 7_501) == "keys"
    assert subset_path(60_000, 30_000) == "keys"
    assert subset_path(60_000, 52_499) == "keys"
    assert subset_path(60_000, 52_500) == "complement"  # 8(n − ℓ) = n
    assert subset_path(60_000, 60_000) == "complement"
    assert subset_path(1, 1) == "complement"
    assert subset_path(8, 1) == "distinct"
    # chunk memory counts the n keys on the keys path only
    assert sampling.chunk_size(mixture_degree=30_000, dim=10, n=60_000) == max(
        1, sampling.GATHER_BUDGET // (30_000 + 60_000 + 10 * (1 + 2 * 469))
    )


def test_acceptance_at_mnist_sizes() -> None:
    # n = 60000: ℓ = 256 draws are all distinct with probability ≈ 0.58
    assert acceptance(60_000, 1) == 1.0
    assert acceptance(60_000, 256) == pytest.approx(math.exp(-256 * 255 / 120_000), rel=1e-2)
    assert uses_rejection(60_000, 256)  # the former rule the benches compare with
    assert not uses_rejection(60_000, 2048)


@pytest.mark.parametrize(
    ("n", "size"),
    [
        *REGIMES,
        (1, 1),
        (5, 5),
        (100, 1),
        (1000, 31),
        (1000, 500),
        (1000, 501),
        (1000, 999),
        (60_000, 256),
        (3, 2),
        (2, 1),
        (2, 2),
    ],
)
def test_rows_are_distinct_and_in_range(n: int, size: int, path: str) -> None:
    if n >= 1000 and path != subset_path(n, size):
        pytest.skip("a forced path at large n is slow by design (subset_path avoids it)")
    rows = draw(n, size, count=2_000)
    assert rows.min() >= 0
    assert rows.max() < n
    ordered = np.sort(rows, axis=1)
    assert (np.diff(ordered, axis=1) > 0).all()


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_subsets_uniform_chi_square(n: int, size: int, path: str) -> None:
    rows = draw(n, size)
    index = {s: i for i, s in enumerate(itertools.combinations(range(n), size))}
    assert len(index) == math.comb(n, size)
    codes = np.array([index[tuple(sorted(r))] for r in rows.tolist()])
    counts = np.bincount(codes, minlength=len(index))
    assert DRAWS / len(index) >= 20  # enough per cell for the chi-square approximation
    assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_each_position_uniform(n: int, size: int, path: str) -> None:
    if path == "complement":
        pytest.skip("the complement lists its set in increasing order")
    rows = draw(n, size, seed=99)
    for position in range(size):
        counts = np.bincount(rows[:, position], minlength=n)
        assert stats.chisquare(counts).pvalue > 1e-4, f"position {position}"


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_pair_inclusion_frequencies(n: int, size: int, path: str) -> None:
    rows = draw(n, size, seed=7)
    ind = indicators(rows, n)
    single = size / n
    pair = size * (size - 1) / (n * (n - 1))
    freq1 = ind.mean(axis=0)
    z1 = (freq1 - single) / math.sqrt(single * (1 - single) / DRAWS)
    assert np.abs(z1).max() < 5
    co = (ind.T @ ind) / DRAWS
    a, b = np.triu_indices(n, k=1)
    if pair == 0:  # ℓ = 1: never two members
        assert (co[a, b] == 0).all()
        return
    z2 = (co[a, b] - pair) / math.sqrt(pair * (1 - pair) / DRAWS)
    assert np.abs(z2).max() < 5


@pytest.mark.parametrize(("n", "size"), REGIMES)
def test_rows_are_independent(n: int, size: int, path: str) -> None:
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


@pytest.mark.parametrize(("n", "size"), [(8, 7), (9, 8), (16, 14), (20, 18), (3, 3)])
def test_complement_rows_come_sorted(n: int, size: int) -> None:
    # The complement path lists its set in increasing order (positions carry no randomness;
    # the mechanisms only use the set).
    assert subset_path(n, size) == "complement"
    rows = draw(n, size, count=500, seed=4)
    assert (np.diff(rows, axis=1) > 0).all()


@pytest.mark.parametrize("n", [1, 2, 7])
def test_whole_range(n: int) -> None:
    rows = draw(n, n, count=50)
    assert (rows == np.arange(n)).all()


class _ScriptedIntegers(SecureRandom):
    """Returns the given draws in turn and records the shapes asked for."""

    def __init__(self, tables: list[list[int] | list[list[int]]]) -> None:
        super().__init__(key=bytes(32))
        self.tables = tables
        self.shapes: list[int | tuple[int, ...]] = []

    def integers(self, high: int, shape: int | tuple[int, ...]) -> np.ndarray:
        self.shapes.append(shape)
        return np.array(self.tables.pop(0), dtype=np.int64).reshape(shape)


def test_only_repeated_positions_are_redrawn() -> None:
    # Row 0: positions 2 and 3 repeat position 0's value 3; row 1 is distinct at once. The
    # redraw gives position 2 a 1 (repeats position 1) and position 3 a 7: only position 2
    # is redrawn again. The earliest position of each repeated value keeps it.
    source = _ScriptedIntegers([[[3, 1, 3, 3, 2], [0, 1, 2, 4, 5]], [1, 7], [9]])
    out = distinct_draws(10, 5, 2, generator=source)
    assert source.shapes == [(2, 5), 2, 1]
    assert out.tolist() == [[3, 1, 9, 7, 2], [0, 1, 2, 4, 5]]


class _Counting(SecureRandom):
    def __init__(self, seed: int) -> None:
        super().__init__(key=bytes([seed]) * 32)
        self.drawn = 0

    def integers(self, high: int, shape: int | tuple[int, ...]) -> np.ndarray:
        self.drawn += math.prod(shape) if isinstance(shape, tuple) else shape
        return super().integers(high, shape)


@pytest.mark.parametrize(
    ("n", "size", "expected"),
    [
        # E[draws] = n·(H_n − H_{n−ℓ}) (coupon collector)
        (1000, 125, 1000 * (math.fsum(1 / i for i in range(876, 1001)))),
        (1000, 900, 1000 * (math.fsum(1 / i for i in range(901, 1001)))),  # 100 excluded
        (60_000, 256, 60_000 * math.fsum(1 / i for i in range(59_745, 60_001))),
    ],
)
def test_draws_are_linear_in_the_subset_size(n: int, size: int, expected: float) -> None:
    source = _Counting(5)
    uniform_subsets(n, size, 400, generator=source, device=CPU)
    per_row = source.drawn / 400
    assert per_row < 2 * min(size, n - size)  # O(ℓ), not O(n) keys nor whole-row retries
    assert per_row == pytest.approx(expected, rel=0.02)


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


# --- the keys path: boundary ties ------------------------------------------------------


class _TinyKeys(SecureRandom):
    """Sort keys from {0, 1, 2} only: boundary ties in most rows."""

    def keys(self, shape: tuple[int, ...], *, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.randint(3, shape, device=device).to(torch.int32)


def test_key_path_exactly_uniform_under_frequent_ties() -> None:
    # Without the redraw, topk breaks ties by position and favours small indices: this
    # chi-square then fails by far (p < 1e-100); with it, every 2-subset of 5 is equally likely.
    n, size = 5, 2
    rows = _by_keys(n, size, DRAWS, _TinyKeys.from_seed(3), CPU).numpy()
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
    out = _by_keys(6, 3, 2, source, CPU)
    assert source.shapes == [(2, 6), (1, 6)]
    assert sorted(out[0].tolist()) == [2, 3, 4]
    assert sorted(out[1].tolist()) == [3, 4, 5]


def test_tie_inside_the_subset_is_kept() -> None:
    source = _ScriptedKeys([[[1, 1, 5, 9, 7, 8]]])
    out = _by_keys(6, 3, 1, source, CPU)
    assert source.shapes == [(1, 6)]
    assert sorted(out[0].tolist()) == [0, 1, 2]


# --- gather_sum: the fused gather-and-sum and its rounding bound ---------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 5, 16, 64, 65, 100, 128, 256])
def test_gather_sum_is_the_sum_within_its_bound(dtype: torch.dtype, size: int) -> None:
    n, d, count = 300, 7, 50
    rng = np.random.default_rng(size)
    rows = rng.uniform(0, 1, (n, d))
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1.0)
    table = torch.tensor(rows, dtype=dtype)
    idx = uniform_subsets(n, size, count, generator=SecureRandom.from_seed(size), device=CPU)
    got = gather_sum(table, idx) / size
    assert got.dtype == torch.float64
    exact = table.double().numpy()[idx.numpy()].sum(axis=1) / size  # float64: ~1e-16
    bound = gather_sum_error(1.0, terms=size, magnitude=1.0, dtype=dtype)
    own = (bound - float_error.stored_rows(1.0)) / 2
    assert np.linalg.norm(got.numpy() - exact, axis=1).max() <= own
    assert np.allclose(got.numpy(), exact, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-14)


def test_float32_block_rounding_is_real_and_covered() -> None:
    # One block of 16 in float32: 1 and fifteen 2⁻²⁵ (below half an ulp of 1 each). The
    # computed sum loses ≥ 10⁻⁸ — far above the float64 bound (≈ 2·10⁻¹⁵), within γ_16's.
    table = torch.zeros((16, 2), dtype=torch.float32)
    table[0, 0] = 1.0
    table[1:, 0] = 2.0**-25
    idx = torch.arange(16).reshape(1, 16)
    got = float(gather_sum(table, idx)[0, 0])
    exact = 1.0 + 15 * 2.0**-25
    loss = abs(got - exact)
    f64_own = (float_error.scaled_sum(1.0, terms=16, magnitude=1.0) - 2.0**-23) / 2
    own = (gather_sum_error(1.0, terms=16, magnitude=1.0, dtype=torch.float32) - 2.0**-23) / 2
    assert loss > 1e-8 > 100 * f64_own
    assert loss <= own * (1.0 + 15 * 2.0**-25)


def test_block_bound_does_not_grow_with_the_degree() -> None:
    at = {
        ell: gather_sum_error(1.0, terms=ell, magnitude=1.0, dtype=torch.float32)
        for ell in (16, 64, 256, 4096)
    }
    plain = float_error.scaled_sum(1.0, terms=256, magnitude=1.0, dtype=torch.float32)
    assert at[64] <= at[256] <= at[4096] < 1.001 * at[64]  # γ_64 in float32 dominates
    assert at[16] < at[64] / 3  # one block of ℓ ≤ 64: γ_ℓ
    assert at[256] < plain / 3.5  # plain float32 summation of 256 terms: γ_257
    assert sampling.SUM_BLOCK == 64
    with pytest.raises(ValueError):
        float_error.blocked_sum(1.0, terms=3, block=4, magnitude=1.0)
