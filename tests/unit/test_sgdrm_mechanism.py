"""SGDRM's sampler is exactly what its accountant assumes: Bernoulli inclusion (drawn as a
binomial size and a uniform subset: tests/unit/test_sampling_binomial.py), clipped Gaussian
coefficients, independent across mixtures; and ``lazy_bernoulli``, exact from about one
keystream byte per entry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms.sampling import lazy_bernoulli
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm.generate import generate
from tests.counting_random import CountingRandom


def _coefficients(n: int, ell: int, T: int, c: float, seed: int = 0) -> np.ndarray:
    # Identity features expose each mixture's coefficient vector.
    chunks = generate(
        torch.eye(n, dtype=torch.float64),
        torch.zeros((n, 1), dtype=torch.float64),
        mixture_width=ell,
        n_samples=T,
        coefficient_bound=c,
        sigma=0.0,
        generator=SecureRandom.from_seed(seed),
    )
    return torch.cat([x for x, _ in chunks]).numpy()


def test_inclusion_is_bernoulli_and_coefficients_are_clipped_gaussians() -> None:
    n, ell, T, c = 50, 5, 4000, 0.3
    C = _coefficients(n, ell, T, c)
    included = C != 0
    q = ell / n
    # Inclusion count per mixture ~ Binomial(n, q): mean nq, variance nq(1 − q).
    counts = included.sum(axis=1)
    mean, var = n * q, n * q * (1 - q)
    assert abs(counts.mean() - mean) < 5 * math.sqrt(var / T)
    assert abs(counts.var() - var) < 0.1 * var
    # Every record is included at rate q.
    per_record = included.mean(axis=0)
    assert np.abs(per_record - q).max() < 5 * math.sqrt(q * (1 - q) / T)
    values = C[included]
    assert np.abs(values).max() <= c
    # Clipped N(0, 1/ℓ): compare the empirical CDF inside (−c, c) with the normal's.
    inside = values[np.abs(values) < c]
    ks = stats.kstest(
        inside,
        stats.truncnorm(-c * math.sqrt(ell), c * math.sqrt(ell), scale=1 / math.sqrt(ell)).cdf,
    )
    assert ks.pvalue > 1e-4
    expected_clip = 2 * stats.norm.sf(c * math.sqrt(ell))
    assert abs((np.abs(values) == c).mean() - expected_clip) < 0.02


def test_mixtures_are_independent() -> None:
    C = _coefficients(40, 8, 3000, 1.0, seed=3) != 0
    a, b = C[:-1].ravel().astype(float), C[1:].ravel().astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


@pytest.mark.parametrize(
    ("n", "ell", "T", "threads"),
    [
        (60, 6, 500, 1),
        (60, 6, 500, 2),  # the tiles shared out over threads
        (3000, 2, 200, 2),  # fewer entries than records: the rows gathered
    ],
)
def test_mixtures_are_the_coefficients_times_the_records(
    n: int, ell: int, T: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draws do not depend on the records: with the same seed, identity features expose
    the coefficient matrix C, and any records give C @ [X, Y] (float64, up to rounding), here
    103 columns, two tiles, the second across the features' end and the labels."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    c = 0.5
    C = _coefficients(n, ell, T, c, seed=4)
    rng = np.random.default_rng(0)
    X, Y = rng.random((n, 100)), rng.random((n, 3))

    def mixtures(features: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        chunks = generate(
            features,
            labels,
            mixture_width=ell,
            n_samples=T,
            coefficient_bound=c,
            sigma=0.0,
            generator=SecureRandom.from_seed(4),
        )
        x, y = zip(*chunks, strict=True)
        return torch.cat(x).double().numpy(), torch.cat(y).double().numpy()

    x, y = mixtures(torch.from_numpy(X), torch.from_numpy(Y))
    np.testing.assert_allclose(x, C @ X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(y, C @ Y, rtol=0, atol=1e-12)
    # float32 records: the float64 sums of their (exact) float64 values, returned in float32.
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    x, y = mixtures(torch.from_numpy(X32), torch.from_numpy(Y32))
    np.testing.assert_allclose(x, C @ X32.astype(np.float64), rtol=2**-23, atol=1e-12)
    np.testing.assert_allclose(y, C @ Y32.astype(np.float64), rtol=2**-23, atol=1e-12)


def test_noise_scale() -> None:
    chunks = generate(
        torch.zeros((10, 3)),
        torch.zeros((10, 2)),
        mixture_width=2,
        n_samples=5000,
        coefficient_bound=1.0,
        sigma=2.5,
        generator=SecureRandom.from_seed(1),
    )
    X = torch.cat([x for x, _ in chunks]).numpy()
    assert abs(X.std() - 2.5) < 0.05


# --- inclusion bits: exactly Bernoulli(ℓ/n) from about one byte each ---------------------


@pytest.mark.parametrize(
    ("k", "m"), [(5, 50), (1, 3), (2, 3), (255, 256), (1, 60_000), (256, 60_000), (7, 7), (0, 9)]
)
def test_lazy_bernoulli_law_and_bytes(k: int, m: int) -> None:
    rows, cols = 400, 250
    source = CountingRandom(k % 256)
    bits = lazy_bernoulli(k, m, (rows, cols), generator=source)
    assert bits.shape == (rows, cols) and bits.dtype == bool
    p, draws = k / m, rows * cols
    # About one byte per entry (4 for SecureRandom.bernoulli's 32-bit words); p = 1 reads none.
    assert source.used <= draws * (1 + 3 / 255) + 64
    if p in (0.0, 1.0):
        assert (bits == bool(p)).all()
        return
    # Total count ~ Binomial(draws, p), row counts ~ Binomial(cols, p), every entry at rate p.
    total = int(bits.sum())
    assert stats.binomtest(total, draws, p).pvalue > 1e-4
    row_counts = np.bincount(bits.sum(axis=1), minlength=cols + 1)
    expected = stats.binom(cols, p).pmf(np.arange(cols + 1)) * rows
    keep = expected >= 5
    observed = np.append(row_counts[keep], row_counts[~keep].sum())
    wanted = np.append(expected[keep], expected[~keep].sum())
    if wanted[-1] < 5:  # fold a thin tail into the last kept cell
        observed, wanted = observed[:-1], wanted[:-1]
        observed[-1] += row_counts[~keep].sum()
        wanted[-1] += expected[~keep].sum()
    wanted *= observed.sum() / wanted.sum()
    if observed.size > 1:
        assert stats.chisquare(observed, wanted).pvalue > 1e-4
    per_entry = bits.mean(axis=0)
    assert np.abs(per_entry - p).max() < 5 * math.sqrt(p * (1 - p) / rows) + 1e-12


def test_lazy_bernoulli_reads_further_bytes_only_on_a_tie() -> None:
    # p = 1/3 = 0.555…₂₅₆ (digits 85, 85, …): a first byte of 85 ties and reads another.
    class Scripted(SecureRandom):
        def __init__(self, tables: list[list[int]]) -> None:
            super().__init__(key=bytes(32))
            self.tables = tables
            self.sizes: list[int] = []

        def words(self, count: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
            self.sizes.append(count)
            return np.array(self.tables.pop(0), dtype=dtype)

    source = Scripted([[84, 85, 86, 85], [85, 0], [200]])
    bits = lazy_bernoulli(1, 3, (4,), generator=source)
    assert source.sizes == [4, 2, 1]
    assert bits.tolist() == [True, False, False, True]
    # p = 1/2 = 0.80₂₅₆ ends after one digit: 128 decides False, no second byte.
    source = Scripted([[127, 128, 255]])
    assert lazy_bernoulli(1, 2, (3,), generator=source).tolist() == [True, False, False]
    assert source.sizes == [3]
