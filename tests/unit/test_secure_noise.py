"""The secure sampler: exact rounded-Gaussian law, lattice plans that keep the accountant's
noise multiplier, and no floating-point leak (a Haney et al. 2022 style precision attack)."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator

import mpmath
import numpy as np
import pytest
import torch
from scipy.special import ndtri
from scipy.stats import chisquare, norm

from dpcore.mechanisms import rounded_gaussian
from dpcore.mechanisms.noise import (
    MAX_SLACK,
    MIN_SLACK,
    TABLE_LIMIT,
    FastNoise,
    SecureNoise,
    lattice_plan,
)
from dpcore.mechanisms.rounded_gaussian import RoundedGaussian, table_size
from dpcore.mechanisms.secure_random import SecureRandom


@pytest.fixture(autouse=True)
def _high_precision() -> Iterator[None]:
    # mpmath's precision is global: other test modules may have lowered it.
    with mpmath.workprec(600):
        yield


def _cdf(k: int, scale: float) -> mpmath.mpf:
    """P(|round(N(0, s²))| ≤ k) to 600 bits."""
    return mpmath.erf((k + mpmath.mpf(0.5)) / (mpmath.mpf(scale) * mpmath.sqrt(2)))


def _pmf(scale: float, support: np.ndarray) -> np.ndarray:
    return norm.cdf((support + 0.5) / scale) - norm.cdf((support - 0.5) / scale)


@pytest.mark.parametrize("scale", [0.7, 2.5, 40.0, 300.0])
def test_draws_follow_the_rounded_gaussian(scale: float) -> None:
    draws = RoundedGaussian(scale).sample(1_000_000)
    assert draws.dtype == np.int64
    bound = int(4 * scale) + 1
    support = np.arange(-bound, bound + 1)
    expected = _pmf(scale, support)
    inside = draws[np.abs(draws) <= bound]
    observed = np.bincount(inside + bound, minlength=support.size)
    # Pool both tails into one cell so every expected count is large.
    observed = np.append(observed, draws.size - observed.sum())
    expected = np.append(expected, 1 - expected.sum()) * draws.size
    keep = expected > 20
    rest = observed[~keep].sum(), expected[~keep].sum()
    observed = np.append(observed[keep], rest[0])
    expected = np.append(expected[keep], rest[1])
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-4


def test_a_wrong_scale_is_rejected_by_the_same_check() -> None:
    # The χ² check above can fail: 2% too little noise is detected.
    draws = RoundedGaussian(2.5 * 0.98).sample(1_000_000)
    support = np.arange(-11, 12)
    expected = _pmf(2.5, support) * draws.size
    observed = np.array([(draws == k).sum() for k in support])
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue < 1e-6


_E = rounded_gaussian.TABLE_ERROR
_TOP = 2**63


def _exact_entry(k: int, scale: float) -> mpmath.mpf:
    return _cdf(k, scale) * mpmath.mpf(2) ** 63


@pytest.mark.parametrize("scale", [0.3, 3.0, 300.0, 1234.5, 8807.0])
def test_table_entries_are_within_the_stated_bound_of_the_exact_cdf(scale: float) -> None:
    sampler = RoundedGaussian(scale)
    entries = sampler._table.entries
    assert sampler.size == table_size(scale) == entries.size
    assert np.all(entries[1:] >= entries[:-1]) and int(entries[-1]) < _TOP
    # Picks, both ends of every Taylor span near them (u = 0 and u = m − 1), and random k.
    per_anchor = max(1, math.floor(scale * math.sqrt(2) / 64))
    picks = {0, 1, sampler.size // 3, sampler.size // 2, sampler.size - 1}
    for k in list(picks):
        anchor = k - k % per_anchor
        picks |= {anchor, anchor + per_anchor - 1, anchor + per_anchor}
    picks |= set(np.random.default_rng(0).integers(0, sampler.size, 40).tolist())
    worst = mpmath.mpf(0)
    for k in sorted(p for p in picks if 0 <= p < sampler.size):
        worst = max(worst, abs(int(entries[k]) - _exact_entry(k, scale)))
    assert worst < _E, worst
    if per_anchor == 1:  # small tables: one Arb erf per entry, within 2
        assert worst < 2, worst
    # The table reaches far enough that its tail is below 2^-130.
    tail = 1 - _cdf(sampler.size - 1, scale)
    assert tail < mpmath.mpf(2) ** -130


def test_the_taylor_build_refuses_a_bound_above_the_stated_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The build checks each span's rigorous bound against E: a smaller E must make it refuse.
    rounded_gaussian._table.cache_clear()
    monkeypatch.setattr(rounded_gaussian, "TABLE_ERROR", 4)
    with pytest.raises(ArithmeticError, match="error bound"):
        RoundedGaussian(1234.5)
    rounded_gaussian._table.cache_clear()


def _word(head: int, negative: bool = False) -> int:
    """The 64-bit draw word: the sign in the top bit, then the 63 head bits of V."""
    assert 0 <= head < _TOP
    return (int(negative) << 63) | head


class _Bytes:
    """A random-bytes source that plays back chosen words and counts the extra ones read."""

    def __init__(self, words: list[int], extra: list[int]) -> None:
        self.chunks = [
            b"".join(word.to_bytes(8, "little") for word in words),
            *(word.to_bytes(8, "little") for word in extra),
        ]
        self.calls = 0

    def __call__(self, n: int) -> bytes:
        chunk = self.chunks[self.calls]
        self.calls += 1
        assert len(chunk) == n
        return chunk

    @property
    def extra_read(self) -> int:
        return self.calls - 1


def _exact_magnitude(scale: float, value: mpmath.mpf) -> int:
    """#{k ≥ 0 : F(k) ≤ value} (F increasing): the first k with F(k) > value, by bisection."""
    high = 1
    while _cdf(high - 1, scale) <= value:
        high *= 2
    low = 0  # F(k) ≤ value for every k < low; F(high − 1) > value
    while low < high - 1:
        middle = (low + high) // 2
        if _cdf(middle - 1, scale) <= value:
            low = middle
        else:
            high = middle
    return low


def _assert_exact(scale: float, head: int, extra: list[int], taken: int, got: int) -> None:
    """Every V with the bits read (the head, then ``taken`` extra words) gives ``got``."""
    bits = head
    for word in extra[:taken]:
        bits = (bits << 64) | word
    lo = mpmath.mpf(bits) / mpmath.mpf(2) ** (63 + 64 * taken)
    hi = lo + mpmath.mpf(2) ** -(63 + 64 * taken)
    assert _exact_magnitude(scale, lo) == got == _exact_magnitude(scale, hi * (1 - 1e-150))


@pytest.mark.parametrize("scale", [5.0, 300.0])
@pytest.mark.parametrize("offset", [-_E - 1, -_E, -1, 0, 1, _E - 1, _E])
def test_draws_near_a_table_entry_read_more_bits_and_stay_exact(scale: float, offset: int) -> None:
    sampler = RoundedGaussian(scale)
    for k in (0, 3, 9):
        head = int(sampler._table.entries[k]) + offset
        for extra in ([0], [2**64 - 1], [2**63, 12345]):
            source = _Bytes([_word(head, negative=k == 3)], extra)
            got = int(sampler.sample(1, random_bytes=source)[0])
            assert (got < 0) == (k == 3 and got != 0)
            # The head alone decides exactly when it is at least E away from the entry.
            taken = source.extra_read
            assert (taken >= 1) == (-_E <= offset < _E), (k, offset, taken)
            _assert_exact(scale, head, extra, taken, abs(got))


def test_draws_beyond_the_table_are_exact() -> None:
    scale = 2.0
    sampler = RoundedGaussian(scale)
    top = _TOP - 1
    # V ≥ 1 − 2^-191: beyond the table, whose tail is below 2^-130.
    extra = [2**64 - 1, 2**64 - 1, 0, 0, 0]
    source = _Bytes([_word(top)], extra)
    got = int(sampler.sample(1, random_bytes=source)[0])
    assert got >= sampler.size
    taken = source.extra_read
    assert taken >= 3  # it read past the all-ones words
    _assert_exact(scale, top, extra, taken, got)


def _hard_words(sampler: RoundedGaussian, rng: np.random.Generator) -> np.ndarray:
    """Words in every kind of guide bucket: random, in marked buckets, in crowded ones, and
    within E + 2 of entries (the undecided band and both its edges)."""
    table = sampler._table
    bits = table.guide_bits
    width = 1 << (63 - bits)
    buckets = np.arange(1 << bits)
    marked = buckets[table.guide[: 1 << bits] == rounded_gaussian.GUIDE_MARK]
    crowded = buckets[table.lowest < 0]
    words = [rng.integers(0, 2**64, 20_000, dtype=np.uint64)]
    for chosen in (marked, crowded):
        if chosen.size:
            j = rng.choice(chosen, 5_000).astype(np.uint64)
            inside = rng.integers(0, width, j.size, dtype=np.uint64)
            words.append(j * np.uint64(width) + inside)
    ks = rng.integers(0, sampler.size, 200)
    near = [int(table.entries[k]) + d for k in ks for d in (-_E - 1, -_E, 0, _E - 1, _E, _E + 1)]
    words.append(np.array([h for h in near if 0 <= h < _TOP], dtype=np.uint64))
    heads = np.concatenate(words) & np.uint64(_TOP - 1)
    signs = rng.integers(0, 2, heads.size, dtype=np.uint64) << np.uint64(63)
    return heads | signs


@pytest.mark.parametrize("scale", [0.3, 0.7, 2.5, 40.0, 300.0, 1234.5, 8807.0])
def test_the_guide_table_and_the_binary_search_give_the_same_draws(scale: float) -> None:
    sampler = RoundedGaussian(scale)
    words = _hard_words(sampler, np.random.default_rng(int(scale * 10)))
    # The same stream for the extra words of the (rare) undecided draws: both paths must
    # read them in the same order and use them the same way.
    guided = sampler.draw(words, SecureRandom.from_seed(1).bytes)
    searched = sampler.search(words, SecureRandom.from_seed(1).bytes)
    assert guided.dtype == np.int32
    assert np.array_equal(guided, searched)
    # Symmetric, and a draw never exceeds what its head (or the exact path) allows.
    assert np.array_equal(
        sampler.draw(words ^ np.uint64(1 << 63), SecureRandom.from_seed(1).bytes), -guided
    )


def test_decided_buckets_read_nothing_more_and_marked_ones_are_rare() -> None:
    sampler = RoundedGaussian(8807.0)  # docs/guide.md's MNIST release: 117 135 entries
    table = sampler._table
    decided = table.guide != rounded_gaussian.GUIDE_MARK
    # Draws in marked buckets take the slower path: few enough of them at this size. Some
    # buckets hold more than two entries (the far tail), so the search fallback is exercised
    # by the guide-against-search test above.
    assert decided.mean() > 0.85
    assert (table.lowest < 0).any()
    # Words in decided buckets: the answer comes from the guide alone, no further bytes.
    bits = table.guide_bits
    index = np.flatnonzero(decided)[:: max(1, decided.sum() // 50_000)].astype(np.uint64)
    words = index << np.uint64(63 - bits) | np.uint64((1 << (63 - bits)) - 1)

    def no_more(n: int) -> bytes:
        raise AssertionError("a decided bucket read more bits")

    assert np.array_equal(sampler.draw(words, no_more), sampler.search(words, no_more))


def test_each_draw_reads_eight_bytes_in_one_call() -> None:
    calls: list[int] = []
    stream = SecureRandom.from_seed(3)

    def counted(n: int) -> bytes:
        calls.append(n)
        return stream.bytes(n)

    draws = RoundedGaussian(1234.5).sample(100_000, random_bytes=counted)
    assert draws.shape == (100_000,)
    # One read of 8 bytes a draw (sign and 63 bits of V); an undecided draw (probability
    # below 2^-35 at this size) would read 8 more at a time.
    assert calls == [800_000]


def test_signs_are_uniform_and_zero_is_not_doubled() -> None:
    draws = RoundedGaussian(0.5).sample(400_000)
    positive, negative = (draws > 0).sum(), (draws < 0).sum()
    assert abs(positive - negative) < 5 * math.sqrt(positive + negative)
    assert abs((draws == 0).mean() - _pmf(0.5, np.array([0]))[0]) < 0.005


@pytest.mark.parametrize(
    ("z", "sensitivity", "dim"),
    list(itertools.product([0.05, 1.19, 8.0, 300.0], [1e-3, math.sqrt(2) / 64, 2.0], [1, 10, 784])),
)
def test_lattice_plans_keep_the_noise_multiplier(z: float, sensitivity: float, dim: int) -> None:
    sigma = z * sensitivity
    plan = lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim)
    assert math.log2(plan.lattice).is_integer()
    # Rounding moves each row by ≤ g√d/2, two neighbours' rows apart by ≤ Δ + g√d: the raised
    # σ' must keep σ'/(Δ + g√d) at least the multiplier the accountant was given.
    assert plan.sigma_effective / (sensitivity + plan.lattice * math.sqrt(dim)) >= z
    assert MIN_SLACK <= plan.slack <= MAX_SLACK
    # Past the table limit the table-free draw takes the finest lattice.
    assert plan.tabled == (table_size(plan.scale) <= TABLE_LIMIT)
    if not plan.tabled:
        assert plan.slack < 2 * MIN_SLACK
    assert plan.sigma_effective <= sigma * (1 + plan.slack) * (1 + 1e-9)


@pytest.mark.parametrize(("unit", "error"), [(1.0, 0.0), (1.0, 1e-3), (0.25, 1e-4)])
def test_lattice_plans_cover_relative_to_the_unit(unit: float, error: float) -> None:
    """A step analysed at a unit u below Δ (a Poisson-subsampled sum's contribution radius):
    every distance a ≥ u, moved by the float error and the rounding, keeps its noise
    multiplier; relative to Δ it would not."""
    sigma, sensitivity, dim = 3.0, 2.0, 10_000
    plan = lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error, unit=unit)
    moved = error + plan.lattice * math.sqrt(dim)
    for a in (unit, 1.5 * unit, sensitivity):
        assert (a + moved) / plan.sigma_effective <= a / sigma
    assert plan.cover_unit == unit
    old = lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim, error=error)
    old_moved = error + old.lattice * math.sqrt(dim)
    assert (unit + old_moved) / old.sigma_effective > unit / sigma
    with pytest.raises(ValueError, match="cover unit"):
        lattice_plan(sigma=sigma, sensitivity=sensitivity, dim=dim, unit=2.5)


def test_secure_outputs_are_lattice_points_with_the_planned_noise() -> None:
    noise = SecureNoise()
    rng = np.random.default_rng(1)
    values = torch.as_tensor(rng.uniform(-1, 1, size=(3000, 50)), dtype=torch.float32)
    out = noise(values, sigma=0.2, sensitivity=0.1)
    (plan,) = noise.plans.values()
    assert out.dtype == values.dtype and out.shape == values.shape
    steps = out.double().numpy() / plan.lattice
    assert np.array_equal(steps, np.rint(steps))
    offsets = steps - np.rint(values.double().numpy() / plan.lattice)
    assert abs(offsets.std() - plan.scale) < 0.01 * plan.scale
    assert abs(offsets.mean()) < 0.01 * plan.scale
    assert noise.describe()[0]["sigma_effective"] == plan.sigma_effective


def test_secure_noise_adds_the_sampler_draws_block_by_block() -> None:
    """The lean in-place path equals the plain formula g·(rint(x/g) + K), K the sampler's
    draws of the same stream: each block reads its words, then its rare extra words."""
    rng = np.random.default_rng(2)
    values = torch.as_tensor(rng.uniform(-1, 1, size=(700, 100)), dtype=torch.float32)
    out = SecureNoise(SecureRandom.from_seed(5))(values, sigma=0.2, sensitivity=0.1)
    plan = lattice_plan(sigma=0.2, sensitivity=0.1, dim=100)
    stream = SecureRandom.from_seed(5)
    sampler = RoundedGaussian(plan.scale)
    count = values.numel()
    assert count > 2 * rounded_gaussian.BLOCK  # several blocks, the last one partial
    draws = np.concatenate(
        [
            sampler.sample(min(rounded_gaussian.BLOCK, count - at), random_bytes=stream.bytes)
            for at in range(0, count, rounded_gaussian.BLOCK)
        ]
    )
    steps = np.rint(values.double().numpy().ravel() / plan.lattice)
    expected = ((steps + draws) * plan.lattice).astype(np.float32).reshape(values.shape)
    assert out.dtype == torch.float32
    assert np.array_equal(out.numpy(), expected)
    # Float64 rows come back as float64, and values past 2^53 lattice steps are refused.
    assert SecureNoise()(values.double(), sigma=0.2, sensitivity=0.1).dtype == torch.float64
    with pytest.raises(OverflowError):
        SecureNoise()(torch.full((3, 100), 1e30), sigma=0.2, sensitivity=0.1)


def _precision_attack(outputs0: np.ndarray, outputs1: np.ndarray) -> float:
    """Largest two-proportion z-score of 'the output is a multiple of 2^-j', j = 0 … 60.

    These events are invariant under a shift by 1 in exact arithmetic, so an ideal mechanism
    gives both inputs the same frequencies; a gap is a floating-point leak (the Haney et al.
    2022 'precision-based attack', here with one query per output)."""
    worst = 0.0
    for j in range(61):
        f0 = np.mean(np.floor(outputs0 * 2.0**j) == outputs0 * 2.0**j)
        f1 = np.mean(np.floor(outputs1 * 2.0**j) == outputs1 * 2.0**j)
        pooled = (f0 + f1) / 2
        if 0 < pooled < 1:
            se = math.sqrt(2 * pooled * (1 - pooled) / outputs0.size)
            worst = max(worst, abs(f0 - f1) / se)
    return worst


def _outputs(noise: object, value: float, n: int) -> np.ndarray:
    inputs = torch.full((n, 1), value, dtype=torch.float32)
    return noise(inputs, sigma=1.0, sensitivity=1.0).double().numpy().ravel()  # type: ignore[operator]


def test_precision_attack_breaks_the_fast_sampler() -> None:
    fast = FastNoise(SecureRandom.from_seed(7))
    assert _precision_attack(_outputs(fast, 0.0, 100_000), _outputs(fast, 1.0, 100_000)) > 20


def test_precision_attack_finds_no_advantage_against_the_secure_sampler() -> None:
    secure = SecureNoise()
    score = _precision_attack(_outputs(secure, 0.0, 100_000), _outputs(secure, 1.0, 100_000))
    # 61 tests at |z| > 6: a false alarm has probability below 1e-7.
    assert score < 6


def test_table_cache_is_reused() -> None:
    rounded_gaussian._table.cache_clear()
    RoundedGaussian(17.0)
    RoundedGaussian(17.0)
    assert rounded_gaussian._table.cache_info().hits == 1


def test_tables_build_correctly_from_concurrent_threads() -> None:
    # Embedded mode runs jobs in threads; Arb's precision is process-wide.
    import threading

    rounded_gaussian._table.cache_clear()
    errors: list[BaseException] = []
    built: dict[float, RoundedGaussian] = {}

    def build(scale: float) -> None:
        try:
            built[scale] = RoundedGaussian(scale)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(800.0 + i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for scale, sampler in built.items():
        k = sampler.size // 4
        assert abs(int(sampler._table.entries[k]) - _exact_entry(k, scale)) < _E


def test_noise_too_large_for_a_table_is_drawn_without_one() -> None:
    """σ√d/Δ bounds the scale from below whatever the lattice: past the table budget the plan
    takes the table-free draw at the finest lattice (it used to coarsen the lattice, adding
    up to 43 % noise, and to refuse σ = 1e4 over 784 values); only a scale past what float64
    holds exactly is refused, in words."""
    plan = lattice_plan(sigma=1e4, sensitivity=2.0, dim=784)
    assert not plan.tabled and plan.slack < 2 * MIN_SLACK
    assert plan.sigma_effective / (2.0 + plan.lattice * 28.0) >= 1e4 / 2.0
    with pytest.raises(ValueError, match="secure sampler cannot draw noise"):
        lattice_plan(sigma=1e13, sensitivity=2.0, dim=784)


def _table_free(scale: float) -> RoundedGaussian:
    """The sampler of ``scale`` forced onto the table-free path."""
    saved = rounded_gaussian.TABLE_ENTRIES
    rounded_gaussian.TABLE_ENTRIES = 1
    try:
        sampler = RoundedGaussian(scale)
    finally:
        rounded_gaussian.TABLE_ENTRIES = saved
    assert not sampler.tabled
    return sampler


@pytest.mark.parametrize("scale", [300.0, 1234.5, 8807.0])
def test_table_free_draws_equal_the_table_draws(scale: float) -> None:
    """Both paths compute #{k : F(k) ≤ V} by certified comparisons: on the same words (random,
    in marked and crowded buckets, within E of entries) and the same extra words they give
    the same draws."""
    tabled, free = RoundedGaussian(scale), _table_free(scale)
    words = _hard_words(tabled, np.random.default_rng(int(scale)))
    expected = tabled.draw(words, SecureRandom.from_seed(2).bytes).astype(np.int64)
    got = free.draw(words, SecureRandom.from_seed(2).bytes)
    assert got.dtype == np.int64
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("offset", [-_E - 1, -_E, -1, 0, _E - 1, _E])
def test_table_free_draws_near_an_entry_read_more_bits_and_stay_exact(offset: int) -> None:
    scale = 3.0e6
    sampler = _table_free(scale)
    for k in (0, 7, 123_456, 9_000_000):
        head = rounded_gaussian._span_values(sampler._spans, np.asarray([k]))[0] + offset
        for extra in ([0], [2**64 - 1], [2**63, 12345]):
            source = _Bytes([_word(int(head))], extra)
            got = int(sampler.sample(1, random_bytes=source)[0])
            taken = source.extra_read
            assert (taken >= 1) == (-_E <= offset < _E), (k, offset, taken)
            _assert_exact(scale, int(head), extra, taken, got)


def test_table_free_draws_are_exact_at_large_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """At scales no table reaches (DP-SGD over millions of parameters), random heads give
    #{k : F(k) ≤ V} for every V they allow (600-bit mpmath), also when float64's inverse
    proposes a wrong k (moved up to the limit, then the exact path)."""
    rng = np.random.default_rng(5)
    for scale in (4.0e5, 2.7e8):
        sampler = RoundedGaussian(scale)
        assert not sampler.tabled
        heads = rng.integers(0, _TOP, 60, dtype=np.uint64)
        heads[:3] = (0, _TOP - 2**20, _TOP // 2)
        got = sampler.draw(heads, SecureRandom.from_seed(4).bytes)
        for head in heads.tolist():
            extra = [2**63 + 99, 77]
            source = _Bytes([_word(head)], extra)
            value = int(sampler.sample(1, random_bytes=source)[0])
            # The far tail (the third head) crowds many entries within E: more bits decide.
            _assert_exact(scale, head, extra, source.extra_read, value)
        # A proposal 2 or 40 away: moved back within the limit, or settled exactly.
        for shift in (2.0, -40.0):
            monkeypatch.setattr(
                rounded_gaussian,
                "ndtri",
                lambda p, shift=shift, scale=scale: ndtri(p) - shift / scale,
            )
            moved = sampler.draw(heads, SecureRandom.from_seed(4).bytes)
            assert np.array_equal(moved, got)
        monkeypatch.undo()


def test_table_free_draws_follow_the_rounded_gaussian() -> None:
    """χ² on the draws' residues and bulk: at s = 2·10⁵ the law's cells hold too little mass
    for a per-value test, so the test bins |K| by quantiles of the folded normal (exact bin
    probabilities from the rounded law) and checks each value's low bits are uniform."""
    scale = 2.0e5
    draws = _table_free(scale).sample(400_000, random_bytes=SecureRandom.from_seed(9).bytes)
    edges = np.round(norm.ppf(np.linspace(0.5, 1.0, 41)[1:-1]) * scale).astype(np.int64)
    bounds = np.concatenate([[0], edges, [np.iinfo(np.int64).max]])
    cdf = np.concatenate([[0.0], 2 * norm.cdf((edges - 0.5) / scale) - 1, [1.0]])
    observed = np.histogram(np.abs(draws), bins=bounds)[0]
    expected = np.diff(cdf) * draws.size
    assert chisquare(observed, expected).pvalue > 1e-4
    residues = np.bincount(draws % 16, minlength=16)
    assert chisquare(residues).pvalue > 1e-4
    assert abs((draws > 0).mean() - (draws < 0).mean()) < 0.01


# The draws of the table-free path below, as the implementation before its vectorisation
# gave them (the digest of their little-endian int64 values): speed work must keep every draw.
_TABLE_FREE_DIGEST = "3cee386deaf1f8bbb160c4ed540e37139a5197f65858375a1f06f0ec93f0d7da"


def test_table_free_draws_are_the_pinned_ones_draw_for_draw() -> None:
    """At DP-SGD's scales: random words, and heads within E + 2 of the entries at every span's
    edges (the undecided band, whose draws read further words), give the pinned draws."""
    digest = hashlib.sha256()
    for scale in (4.2e6, 9.1e7):
        sampler = RoundedGaussian(scale)
        assert not sampler.tabled
        spans = sampler._spans
        assert spans is not None
        rng = np.random.default_rng(11)
        edges = np.arange(0, sampler.size, spans.per_anchor)
        ks = np.concatenate([edges, edges[1:] - 1, edges + 1, rng.integers(0, sampler.size, 300)])
        ks = ks[(ks >= 0) & (ks < sampler.size)]
        entries = rounded_gaussian._span_values(spans, ks)
        near = (entries[:, None] + np.arange(-_E - 2, _E + 3, _E // 2)).reshape(-1)
        near = near[(near >= 0) & (near < _TOP)].astype(np.uint64)
        signs = rng.integers(0, 2, near.size, dtype=np.uint64) << np.uint64(63)
        words = np.concatenate([SecureRandom.from_seed(12).words(100_000), near | signs])
        extra = SecureRandom.from_seed(13)
        digest.update(sampler.draw(words, extra.bytes).astype("<i8").tobytes())
        assert extra.position > 0  # some draws took the exact path
        drawn = sampler.sample(70_000, random_bytes=SecureRandom.from_seed(14).bytes)
        digest.update(drawn.astype("<i8").tobytes())
    assert digest.hexdigest() == _TABLE_FREE_DIGEST
