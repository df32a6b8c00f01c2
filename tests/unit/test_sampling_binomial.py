"""Poisson inclusion as a binomial count plus a uniform subset of that size: the count is
exactly Binomial(n, ℓ/n) (``dpcore.mechanisms.binomial``), through the fast table and through
the refinement, and the subsets include every record independently at rate ℓ/n."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from dpcore.mechanisms import binomial
from dpcore.mechanisms.binomial import BinomialTable, cdf_bounds
from dpcore.mechanisms.sampling import poisson_subsets
from dpcore.mechanisms.secure_random import SecureRandom
from tests.counting_random import CountingRandom

# A correct sampler fails a test at most this often.
ALPHA = 1e-4


def _exact_cdf(n: int, a: int, b: int, upto: int | None = None) -> tuple[list[int], int]:
    """F(0), …, F(upto) of Binomial(n, a/b) exactly, as numerators over one denominator bⁿ:
    the terms C(n, j)·aʲ·(b − a)ⁿ⁻ʲ are integers, each from the last by exact division."""
    upto = n if upto is None else upto
    term, total, out = (b - a) ** n, 0, []
    for j in range(upto + 1):
        if j:
            term = term * (n - j + 1) * a // (j * (b - a))
        total += term
        out.append(total)
    return out, b**n


def _chi_square(draws: np.ndarray, pmf: np.ndarray) -> float:
    """p-value of the counts of ``draws`` against ``pmf`` (on 0..len − 1), neighbouring cells
    pooled until each expects at least 5 draws; 0 for a draw the law cannot produce."""
    observed = np.bincount(draws, minlength=pmf.size).astype(float)
    if observed.size > pmf.size or observed[pmf == 0].any():
        return 0.0
    cells_o, cells_e = [0.0], [0.0]
    for o, e in zip(observed, pmf * draws.size, strict=True):
        if cells_e[-1] >= 5:
            cells_o.append(0.0)
            cells_e.append(0.0)
        cells_o[-1] += o
        cells_e[-1] += e
    if cells_e[-1] < 5 and len(cells_e) > 1:  # a thin last cell joins the one before
        last_o, last_e = cells_o.pop(), cells_e.pop()
        cells_o[-1] += last_o
        cells_e[-1] += last_e
    if len(cells_o) < 2:
        return 1.0
    return float(stats.chisquare(cells_o, cells_e).pvalue)


@pytest.mark.parametrize(
    ("n", "a", "b"), [(1, 1, 2), (7, 3, 7), (50, 5, 50), (300, 100, 300), (2000, 64, 2000)]
)
@pytest.mark.parametrize("precision", [8, 64, 128])
def test_cdf_bounds_enclose_the_exact_cdf(n: int, a: int, b: int, precision: int) -> None:
    lows, highs = cdf_bounds(n, a, b, precision)
    exact, denominator = _exact_cdf(n, a, b)
    assert len(lows) == n + 1 and lows[-1] == highs[-1] == 1 << precision
    for lo, hi, f in zip(lows, highs, exact, strict=True):
        assert lo * denominator <= f << precision <= hi * denominator
    assert all(x <= y for x, y in itertools.pairwise(lows))
    if precision == 128:  # tight: far inside a 64-bit word's resolution
        assert max(hi - lo for lo, hi in zip(lows, highs, strict=True)) < 2**70


# Wrong laws the test must reject, each as a pmf over 0..n.
def _shifted_p(n: int, ell: int) -> np.ndarray:
    return stats.binom(n, 1.05 * ell / n).pmf(np.arange(n + 1))


def _truncated_at_mean(n: int, ell: int) -> np.ndarray:
    pmf = stats.binom(n, ell / n).pmf(np.arange(n + 1))
    pmf[ell] += pmf[ell + 1 :].sum()
    pmf[ell + 1 :] = 0.0
    return pmf


def _fixed_size(n: int, ell: int) -> np.ndarray:
    pmf = np.zeros(n + 1)
    pmf[ell] = 1.0
    return pmf


def _poisson(n: int, ell: int) -> np.ndarray:
    pmf = stats.poisson(ell).pmf(np.arange(n + 1))
    pmf[-1] += stats.poisson(ell).sf(n)
    return pmf


WRONG: dict[str, Callable[[int, int], np.ndarray]] = {
    "p off by 5 %": _shifted_p,
    "CDF truncated at the mean": _truncated_at_mean,
    "fixed size ℓ": _fixed_size,
}


@pytest.mark.parametrize(
    ("n", "ell", "draws"),
    [(50, 5, 40_000), (60_000, 64, 40_000), (60_000, 256, 40_000), (1_000, 500, 40_000)],
)
def test_binomial_law(n: int, ell: int, draws: int) -> None:
    k = binomial.binomial(n, ell, n, draws, generator=SecureRandom.from_seed(n + ell))
    assert k.dtype == np.int64 and k.shape == (draws,)
    assert k.min() >= 0 and k.max() <= n
    assert _chi_square(k, stats.binom(n, ell / n).pmf(np.arange(n + 1))) > ALPHA
    # The same draws reject every wrong law: the test has the power to see them.
    for name, wrong in WRONG.items():
        assert _chi_square(k, wrong(n, ell)) < 1e-8, name
    if n == 50:  # Poisson(ℓ) differs from Binomial(n, ℓ/n) in its variance (5 against 4.5)
        assert _chi_square(k, _poisson(n, ell)) < 1e-8


@pytest.mark.parametrize(("n", "a", "b"), [(0, 1, 2), (9, 0, 4), (9, 4, 4)])
def test_binomial_degenerate_laws_draw_nothing(n: int, a: int, b: int) -> None:
    source = CountingRandom(0)
    k = binomial.binomial(n, a, b, 100, generator=source)
    assert (k == (n if a == b else 0)).all() and source.used == 0


@pytest.mark.parametrize(
    ("n", "a", "b", "precision", "tail"),
    [
        (30, 10, 30, 8, 2.0**-72),  # coarse bounds: most draws straddle a boundary
        (30, 10, 30, 128, 0.4),  # a table that stops early: the upper tail is refined
        (400, 20, 400, 6, 0.3),  # both
    ],
)
def test_refinement_keeps_the_law(
    n: int, a: int, b: int, precision: int, tail: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = BinomialTable(n, a, b, precision=precision, tail=tail)
    refined = []
    original = BinomialTable._refine

    def counting(self: BinomialTable, prefix: int, generator: SecureRandom) -> int:
        k = original(self, prefix, generator)
        refined.append(k)
        return k

    monkeypatch.setattr(BinomialTable, "_refine", counting)
    draws = 20_000
    k = table.draw(draws, generator=SecureRandom.from_seed(precision))
    assert len(refined) > draws // 4  # the refinement did much of the work
    assert _chi_square(k, stats.binom(n, a / b).pmf(np.arange(n + 1))) > ALPHA
    assert _chi_square(k, _shifted_p(n, a * n // b)) < 1e-8


class _Scripted(SecureRandom):
    """Returns the given 64-bit words, in order."""

    def __init__(self, words: list[int]) -> None:
        super().__init__(key=bytes(32))
        self.script = list(words)

    def words(self, count: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
        assert dtype is np.uint64
        out = np.array(self.script[:count], dtype=np.uint64)
        del self.script[:count]
        return out


@pytest.mark.parametrize(("n", "ell", "k"), [(50, 5, 4), (50, 5, 5), (60_000, 64, 70)])
def test_a_word_on_a_boundary_is_refined_to_the_exact_inversion(n: int, ell: int, k: int) -> None:
    """V's first word brackets F(k) exactly: no 64-bit answer is certain, so the sampler must
    read the next word, and answers what inverting F at the 128-bit V gives."""
    exact, denominator = _exact_cdf(n, ell, n, upto=k + 1)
    first = (exact[k] << 64) // denominator
    assert first * denominator < exact[k] << 64 < (first + 1) * denominator  # F(k) inside
    for second in (0, 1, 2**63, 2**64 - 1):
        window = (first << 64) + second  # V ∈ [window, window + 1)·2⁻¹²⁸
        wanted = next(j for j, f in enumerate(exact) if window * denominator < f << 128)
        assert (window + 1) * denominator <= exact[wanted] << 128  # the 128-bit window decides
        assert wanted in (k, k + 1)
        source = _Scripted([first, second])
        assert binomial.table(n, ell, n).draw(1, generator=source).tolist() == [wanted]
        assert source.script == []  # exactly two words read


def test_poisson_subsets_shape() -> None:
    n, ell, count = 30, 6, 500
    members, pointers = poisson_subsets(n, ell, count, generator=SecureRandom.from_seed(0))
    assert members.dtype == pointers.dtype == np.int64
    assert pointers.shape == (count + 1,) and pointers[0] == 0 and pointers[-1] == members.size
    assert (np.diff(pointers) >= 0).all() and members.min() >= 0 and members.max() < n
    for t in range(count):
        row = members[pointers[t] : pointers[t + 1]]
        assert (np.diff(row) > 0).all()  # distinct, increasing


def _inclusion(n: int, ell: int, count: int, seed: int) -> np.ndarray:
    members, pointers = poisson_subsets(n, ell, count, generator=SecureRandom.from_seed(seed))
    included = np.zeros((count, n), dtype=bool)
    included[np.repeat(np.arange(count), np.diff(pointers)), members] = True
    return included


def test_poisson_subsets_include_each_record_independently() -> None:
    n, ell, count = 40, 8, 40_000
    q = ell / n
    included = _inclusion(n, ell, count, seed=5).astype(float)
    # Each record at rate q.
    rate_sd = math.sqrt(q * (1 - q) / count)
    assert np.abs(included.mean(axis=0) - q).max() < 5 * rate_sd
    # Records pairwise uncorrelated: a fixed-size subset has covariance −q(1 − q)/(n − 1)
    # (−0.0041 here) between any two; the mean over the pairs has sd ≈ q(1 − q)/√count/√pairs.
    cov = np.cov(included, rowvar=False)
    pairs = cov[~np.eye(n, dtype=bool)]
    pair_sd = q * (1 - q) / math.sqrt(count)
    assert np.abs(pairs).max() < 6 * pair_sd
    assert abs(pairs.mean()) < 6 * pair_sd / math.sqrt(n * (n - 1) / 2)
    # Count per row: Binomial(n, q), variance nq(1 − q) = 6.4 (0 for a fixed size).
    counts = included.sum(axis=1)
    assert abs(counts.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / count)
    assert abs(counts.var() / (n * q * (1 - q)) - 1) < 5 * math.sqrt(2 / count)
    # The whole inclusion vector of a small case: all 2^n patterns at q^|A|(1 − q)^(n − |A|).
    small = _inclusion(4, 1, 40_000, seed=6)
    patterns = np.bincount(small @ (1 << np.arange(4)), minlength=16)
    weights = np.array([bin(a).count("1") for a in range(16)])
    law = 0.25**weights * 0.75 ** (4 - weights)
    assert stats.chisquare(patterns, law * small.shape[0]).pvalue > ALPHA


def test_poisson_subsets_draw_order_ell_bytes_per_row() -> None:
    """O(ℓ) keystream per subset, not one draw per record (n = 60 000 bytes a row before)."""
    n, ell, count = 60_000, 64, 2_000
    source = CountingRandom(1)
    members, _ = poisson_subsets(n, ell, count, generator=source)
    # One 64-bit word for the count, ~4 bytes per member (and a few redraws of repeats).
    assert source.used < 8 * count + 4 * members.size * 1.1
