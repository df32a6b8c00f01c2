"""An exact sampler of the rounded Gaussian K = round(N/g), N ~ N(0, σ²), from secure bits.

Why this distribution: on the lattice gℤ, x_l + g·round(N/g) = g·round((x_l + N)/g) for a
lattice point x_l, so the release is a post-processing of the plain Gaussian mechanism on x_l.
Every accountant written for the continuous Gaussian (RDP, PLD, subsampling, GDP) therefore
holds unchanged, with the sensitivity of x ↦ x_l (see ``dpcore.mechanisms.noise``).

How it samples, in lattice units (s = σ/g): |K| = #{k ≥ 0 : F(k) ≤ V} with
F(k) = P(|K| ≤ k) = erf((k + ½)/(s√2)) and V uniform on [0, 1), and a uniform sign. Each draw
reads one 64-bit word w of the stream: its top bit is the sign, its other 63 bits are the
first 63 bits h of V (so V ∈ [h, h + 1)·2⁻⁶³). The table holds integers T(k) with
|T(k) − 2⁶³F(k)| < E = 2¹⁰ (below). F(k) ≤ V is certain when T(k) + E ≤ h and F(k) > V is
certain when T(k) − E ≥ h + 1; so h alone decides a draw unless it lies within about E of
the entry at the boundary (h within E of some entry: probability below size·2E·2⁻⁶³, i.e.
2⁻³⁵ a draw for 2¹⁷ entries). An undecided draw reads further 64-bit words of V, one at a
time and only while needed, and compares against F(k) recomputed with Arb at the matching
precision (within 2 of 2^bits·F(k)) until decided, bisecting over k; draws beyond the table
(probability < 2⁻¹³⁰) take the same path.

Why the law is exact: the sign bit and the bits of V are independent uniform bits of the
stream. Whether (and how many) further words are read is decided by the bits already read;
the words then read are fresh, uniform and independent of them, so the bits of V read so far
are always a uniform prefix of a uniform V, and the returned magnitude is #{k : F(k) ≤ V}
for that V — a function of V, evaluated by certified comparisons only. So the output law is
the rounded Gaussian, with no approximation to charge to δ, assuming only that the stream's
bits are uniform (and that Arb's error bounds are correct).

Speed: the magnitude for h is looked up in a guide table indexed by the top bits of w (the
sign and the top ``guide_bits`` bits of h): a bucket of h values in which no entry is within
E of any h has one answer, stored with its sign; the other buckets (under 10 % of the draws
at the 2¹⁷-entry tables served) mark their draws, which finish with two comparisons from the
bucket's first entry, or a binary search where the bucket holds more than two entries, and
the certified comparison above. Both paths compute the same function of w.

The table: F at ~9.4·64 anchor points from Arb (python-flint's rigorous ball arithmetic),
with a Taylor series around each anchor (Arb's power series: coefficients as balls) evaluated
vectorised in float64 for the entries up to the next anchor; the error of each entry is
bounded rigorously (Arb radius, float64 rounding of coefficients, Horner's rounding by
Higham's bound, and the series remainder by Cauchy's estimate) and the build refuses a table
whose bound reaches E; tables of s < 45 (one entry per span) take one Arb erf per entry
(within 2). This is much cheaper than one Arb erf per entry (docs/results/implementation.md).

Written here rather than taken from a library: the libraries that offer a secure discrete
Gaussian (e.g. the Canonne–Kamath–Steinke sampler) sample exp(−k²/2s²) weights, whose
subsampled privacy curves are not the Gaussian's; this distribution keeps every Gaussian
accountant valid by post-processing. No library offers an inverse-CDF sampler with certified
comparisons and lazy extra bits, nor a certified vectorised erf table.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import flint
import numpy as np
from scipy.special import ndtri

RandomBytes = Callable[[int], bytes]

_WORD = 64
# The bits of V in a draw's first word (the 64th is the sign).
HEAD_BITS = 63
# The table stops where the folded tail P(|K| > k) falls below 2⁻¹³⁰: |N| > 13.3σ.
TAIL_SIGMAS = 13.3
_GUARD_BITS = 64
# Every table entry T(k) is within TABLE_ERROR of 2⁶³F(k) (rigorous; the build checks it).
TABLE_ERROR = 1 << 10
# Guide table: at most 2^(bits + 1) int32 answers (2 MiB), about 2⁴ buckets per entry.
_GUIDE_BITS_MAX = 18
_GUIDE_BITS_MIN = 8
# A guide entry whose bucket is not decided by the guide alone (``device_draws`` reads it too).
GUIDE_MARK = np.int32(np.iinfo(np.int32).min)
# Scales whose table would hold more entries draw without one (``_Spans``): a table's memory
# (16 bytes an entry, plus its guide) and build time grow with the scale, a span layout's do
# not (about 600 spans at any scale); a table draw is several times faster.
TABLE_ENTRIES = 1 << 20
# Beyond this many entries k and v/g + k would no longer be exact in float64.
SCALE_LIMIT = 1 << 50
# Proposal moves before a table-free draw takes the exact path (one is all float64's inverse
# ever needs away from an entry; the rest are spare).
_MOVES = 4
# Draws mapped per pass: the temporaries stay in the CPU's cache.
BLOCK = 1 << 15
_HEAD_MASK = np.uint64((1 << HEAD_BITS) - 1)
# Taylor spans: anchors every 1/64 in x = (k + ½)/(s√2); the Cauchy bound on a disc of
# radius 1 uses |erf(z)| ≤ 1 + (2/√π)·|Im z|·e^(Im z)² ≤ 4.07 there.
_SPAN = 1.0 / 64
_ERF_DISC_BOUND = 4.1


def _erf_bits(x_num: float, scale: float, bits: int) -> int:
    """⌊2^bits · erf(x_num/(scale·√2))⌋ within 2."""
    with _Prec(bits + _GUARD_BITS):
        value = (flint.arb(x_num) / (flint.arb(scale) * flint.arb(2).sqrt())).erf()
        return _fixed_point(value * flint.arb(2) ** bits, bits)


def _fixed_point(scaled: flint.arb, bits: int) -> int:
    """An integer within 2 of the value in the ball ``scaled`` = 2^bits·F, F ∈ [0, 1).

    Call it at the working precision ``scaled`` was computed with, which must cover its
    integer part (the floor of the midpoint is then exact)."""
    if not scaled.rad() < 1:  # cannot happen with the guard bits; refuse rather than guess
        raise ArithmeticError("Arb could not bound erf tightly enough")
    floor = scaled.mid().floor().unique_fmpz()
    if floor is None:
        raise ArithmeticError("the floor of an exact midpoint was not an integer")
    # Into [0, 2^bits − 1], where 2^bits·F lies: clamping only moves towards the truth.
    return min(max(int(floor), 0), (1 << bits) - 1)


def table_size(scale: float) -> int:
    """Entries of the table for scale s (its memory, 8 bytes an entry, grows with it)."""
    return math.ceil(TAIL_SIGMAS * scale) + 1


# Arb's working precision is one process-wide setting: jobs running in threads (embedded
# mode) must not change it under each other's feet.
_FLINT_LOCK = threading.RLock()


class _Prec:
    """Arb's working precision (and power-series length) for a block, held under the lock
    and restored afterwards."""

    def __init__(self, prec: int, cap: int | None = None) -> None:
        self.prec = prec
        self.cap = cap

    def __enter__(self) -> None:
        _FLINT_LOCK.acquire()
        self.saved = flint.ctx.prec, flint.ctx.cap
        flint.ctx.prec = self.prec
        if self.cap is not None:
            flint.ctx.cap = self.cap

    def __exit__(self, *exc: object) -> None:
        flint.ctx.prec, flint.ctx.cap = self.saved
        _FLINT_LOCK.release()


@dataclass(frozen=True)
class _Table:
    """T(k) for k < size, the thresholds T(k) + E (then a sentinel), and the guide table."""

    entries: np.ndarray  # uint64, |T(k) − 2⁶³F(k)| < E, non-decreasing
    thresholds: np.ndarray  # uint64, T(k) + E for k < size, then twice 2⁶⁴ − 1
    guide: np.ndarray  # int32 signed answers by the top guide_bits + 1 bits of w, or GUIDE_MARK
    lowest: np.ndarray  # int32 by bucket: #{k : thresholds ≤ its start}, −1 past 2 inside
    guide_bits: int


class RoundedGaussian:
    """Sampler of round(N(0, s²)) on ℤ (s in lattice units), exact given uniform bits."""

    def __init__(self, scale: float) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError("the scale must be finite and positive")
        self.scale = float(scale)
        self.size = table_size(self.scale)
        if self.size > SCALE_LIMIT:
            raise ValueError(f"scale {scale:g} is beyond the sampler's range")
        self._spans: _Spans | None = None
        if self.size > TABLE_ENTRIES:
            self._spans = _spans(self.scale, self.size)
        else:
            self._table = _table(self.scale, self.size)

    @property
    def tabled(self) -> bool:
        """Whether draws use a table of every entry (else they compute the entries they need)."""
        return self._spans is None

    @property
    def table(self) -> _Table:
        """The table the draws look up (``dpcore.mechanisms.device_draws`` copies it to a
        device); a table-free sampler has none."""
        if self._spans is not None:
            raise ValueError("a table-free sampler has no table")
        return self._table

    def _entry(self, k: int) -> int:
        """T(k) for 0 ≤ k < size: within E of 2⁶³F(k)."""
        if self._spans is None:
            return int(self._table.entries[k])
        return int(_span_values(self._spans, np.asarray([k], dtype=np.int64))[0])

    def _cdf_bits(self, k: int, bits: int) -> int:
        """⌊2^bits·F(k)⌋ within 2, for any k ≥ 0 and precision."""
        return _erf_bits(k + 0.5, self.scale, bits)

    def sample(self, count: int, *, random_bytes: RandomBytes = os.urandom) -> np.ndarray:
        """``count`` independent draws as int64: 8 bytes each from one ``random_bytes`` call,
        then 8 more per extra word for the rare undecided draw, read in draw order."""
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        words = _words(random_bytes(8 * count))
        out = np.empty(count, dtype=np.int64)
        for at in range(0, count, BLOCK):
            out[at : at + BLOCK] = self.draw(words[at : at + BLOCK], random_bytes)
        return out

    def draw(self, words: np.ndarray, random_bytes: RandomBytes) -> np.ndarray:
        """The draws (int32) of the uint64 ``words``, one a draw (sign bit, then 63 bits of V);
        an undecided draw reads its further words of V from ``random_bytes``."""
        if self._spans is not None:
            return self._draw_spans(words, random_bytes)
        table = self._table
        # The top bit is the sign, the next guide_bits the bucket of h: one shift and one
        # gather give the signed answer of every draw in a decided bucket.
        # (int64 indices: numpy's gather converts uint64 ones first.)
        index = (words >> np.uint64(_WORD - 1 - table.guide_bits)).view(np.int64)
        out = np.take(table.guide, index)
        marked = np.flatnonzero(out == GUIDE_MARK)
        if marked.size:
            marked_words = words[marked]
            # first(h) for a draw in a marked bucket: from the count at the bucket's start,
            # two comparisons when the bucket holds at most two thresholds, else a search.
            lowest = table.lowest[index[marked] & ((1 << table.guide_bits) - 1)]
            head = marked_words & _HEAD_MASK
            crowded = np.flatnonzero(lowest < 0)
            np.maximum(lowest, 0, out=lowest)
            first = lowest.astype(np.intp)
            first += table.thresholds[lowest] <= head
            first += table.thresholds[lowest + 1] <= head
            if crowded.size:
                first[crowded] = np.searchsorted(
                    table.thresholds[: self.size], head[crowded], side="right"
                )
            out[marked] = self._finish(marked_words, head, first, random_bytes)
        return out

    def _draw_spans(self, words: np.ndarray, random_bytes: RandomBytes) -> np.ndarray:
        """``draw`` without a table (int64): a float64 inverse of the folded normal's tail
        proposes k, and only certified comparisons decide. k is returned when T(k − 1) + E ≤ h
        (so F(k − 1) ≤ V, and F(j) ≤ V for every j < k: F increases) and T(k) − E ≥ h + 1
        (F(k) > V): then k = #{j : F(j) ≤ V}. A certain F(k − 1) > V moves k down, a certain
        F(k) ≤ V moves it up; a draw still open after a few moves (h within E of T at the
        boundary, or a proposal far off) takes the exact path. Every branch is a function of
        the word and of the further words then read: the law is the table path's."""
        spans = self._spans
        assert spans is not None
        head = words & _HEAD_MASK
        # V ≈ h·2⁻⁶³ and P(|N| > x) = 1 − V, i.e. x = −s·Φ⁻¹((1 − V)/2); 1 − V is formed
        # from the integer 2⁶³ − h, so the far tail keeps its relative precision.
        tail = (np.uint64(1 << HEAD_BITS) - head).astype(np.float64) * 2.0**-64
        x = -ndtri(tail) * self.scale
        np.clip(x, 0.0, float(self.size), out=x)
        k = (np.floor(x - 0.5) + 1.0).astype(np.int64)
        np.clip(k, 0, self.size, out=k)
        pending = np.arange(words.size)
        edge = np.uint64(TABLE_ERROR)
        for move in range(_MOVES):
            # The first pass takes every draw: whole arrays, no gathers.
            kk, hh = (k, head) if move == 0 else (k[pending], head[pending])
            below = np.maximum(kk - 1, 0)
            above = np.minimum(kk, self.size - 1)
            low_values, high_values = _span_pair(spans, below, above)
            # Non-negative int64 entries: the same bits as uint64, no copy.
            low, high = low_values.view(np.uint64), high_values.view(np.uint64)
            beyond = hh + np.uint64(1) + edge
            lower_ok = (kk == 0) | (low + edge <= hh)
            upper_ok = (kk < self.size) & (high >= beyond)
            down = (kk > 0) & (low >= beyond)
            up = (kk < self.size) & (high + edge <= hh)
            if move == 0:
                k = kk - down + up
            else:
                k[pending] = kk - down + up
            pending = pending[~(lower_ok & upper_ok)]
            if not pending.size:
                break
        magnitude = k
        for i in pending:
            magnitude[i] = self.exact_magnitude(int(head[i]), 0, random_bytes)
        # The sign bit as 0 or −1: (m ^ s) − s negates where s = −1 (|m| ≤ size < 2⁵⁰), several
        # times faster than a masked negation.
        flip = -(words >> np.uint64(_WORD - 1)).view(np.int64)
        np.bitwise_xor(magnitude, flip, out=magnitude)
        magnitude -= flip
        return magnitude

    def search(self, words: np.ndarray, random_bytes: RandomBytes) -> np.ndarray:
        """The same draws as ``draw`` without the guide table: a binary search for each."""
        if self._spans is not None:
            raise ValueError("a table-free sampler has no table to search")
        words = np.asarray(words, dtype=np.uint64)
        head = words & _HEAD_MASK
        first = np.searchsorted(self._table.thresholds[: self.size], head, side="right")
        return self._finish(words, head, first, random_bytes).astype(np.int64)

    def _finish(
        self, words: np.ndarray, head: np.ndarray, first: np.ndarray, random_bytes: RandomBytes
    ) -> np.ndarray:
        """Signed draws (int32) given first = #{k : T(k) + E ≤ h}: those k have F(k) ≤ V for
        sure (T is non-decreasing); F(first) > V is certain when T(first) − E ≥ h + 1, i.e.
        thresholds[first] ≥ h + 1 + 2E (no overflow: thresholds < 2⁶³ + E); otherwise, and
        beyond the table, the exact path decides."""
        thresholds = self._table.thresholds
        undecided = (first >= self.size) | (
            thresholds[first] < head + np.uint64(1 + 2 * TABLE_ERROR)
        )
        magnitude = first.astype(np.int32)
        for i in np.flatnonzero(undecided):
            magnitude[i] = self.exact_magnitude(int(head[i]), int(first[i]), random_bytes)
        negative = (words >> np.uint64(_WORD - 1)).astype(bool)
        np.negative(magnitude, out=magnitude, where=negative)
        return magnitude

    def exact_magnitude(self, head: int, start: int, random_bytes: RandomBytes) -> int:
        """#{k : F(k) ≤ V} for V = 0.head…, reading more bits of V only when needed; every
        k < start has F(k) ≤ V already certified."""
        extra: list[int] = []
        low = start  # F(k) ≤ V for every k < low
        # F(k) > V is certain from the table where T(k) − E ≥ h + 1: the first such k bounds
        # the answer; beyond the table (or without one), an exponential search finds a k with
        # F(k) > V.
        high = self.size
        if self._spans is None:
            high = int(np.searchsorted(self._table.entries, np.uint64(head + 1 + TABLE_ERROR)))
        if high >= self.size:
            step = 1
            high = max(low, self.size)
            while self._at_most(high, head, extra, random_bytes):
                low, high, step = high + 1, high + 1 + step, 2 * step
        # Bisection (F(k) ≤ V for k < low, F(high) > V): O(log) certified comparisons even
        # where many entries lie within E of the draw (the far tail, where they crowd).
        while low < high:
            middle = (low + high) // 2
            if self._at_most(middle, head, extra, random_bytes):
                low = middle + 1
            else:
                high = middle
        return low

    def _at_most(self, k: int, head: int, extra: list[int], random_bytes: RandomBytes) -> bool:
        """Whether F(k) ≤ V, deciding with as many bits of V as it takes."""
        rounds = 0
        while True:
            bits = HEAD_BITS + _WORD * rounds
            while len(extra) < rounds:
                extra.append(int.from_bytes(random_bytes(8), "little"))
            prefix = head
            for word in extra[:rounds]:
                prefix = (prefix << _WORD) | word
            if rounds == 0 and k < self.size:
                table, error = self._entry(k), TABLE_ERROR
            else:
                table, error = self._cdf_bits(k, bits), 2
            # V ∈ [prefix, prefix + 1)·2^-bits and 2^bits·F(k) ∈ (table − error, table + error).
            if prefix >= table + error:
                return True
            if prefix + 1 <= table - error:
                return False
            rounds += 1


def _span_values(spans: _Spans, k: np.ndarray) -> np.ndarray:
    """T(k) (int64) for 0 ≤ k < size: the entries ``_entries`` would hold before its running
    maximum (the same Horner in the same order, so each within its span's bound < E; the
    maximum is not needed here, where no search relies on the order)."""
    span = k // spans.per_anchor
    offsets = (k - span * spans.per_anchor).astype(np.float64)
    return _span_entries(spans, span, _horner(_span_rows(spans, span), offsets))


def _span_pair(spans: _Spans, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_span_values`` of ``low`` and of ``high`` ≥ ``low`` (one draw's k − 1 and k): the
    coefficients gathered once for both where they share a span (all but about one draw in m,
    m ≥ 1000 entries a span on this path), the others' computed on their own — the same
    values."""
    per = spans.per_anchor
    span = low // per
    rows = _span_rows(spans, span)
    low_values = _span_entries(spans, span, _horner(rows, (low - span * per).astype(np.float64)))
    # Offsets kept inside the span, so a k of the next span gives a finite (discarded) value.
    within = np.minimum(high - span * per, per - 1).astype(np.float64)
    high_values = _span_entries(spans, span, _horner(rows, within))
    other = np.flatnonzero(high // per != span)
    if other.size:
        high_values[other] = _span_values(spans, high[other])
    return low_values, high_values


def _span_rows(spans: _Spans, span: np.ndarray) -> np.ndarray:
    """Every coefficient row gathered at once (rows b̂_1 … b̂_{n−1}, a column per k): the same
    values, element for element, as gathering row by row."""
    return np.take(spans.coefficients, span, axis=1)


def _span_entries(spans: _Spans, span: np.ndarray, increment: np.ndarray) -> np.ndarray:
    """anchor + rint(increment), capped at 2⁶³ − 1 and clamped at 0 (overwrites increment)."""
    top = (1 << HEAD_BITS) - 1
    anchors = spans.anchors[span]
    # Increments stay below 2⁶³/64 (a span is 1/64 in x, erf′ ≤ 2/√π): no overflow.
    values = np.rint(increment, out=increment).astype(np.int64)
    np.minimum(values, top - anchors, out=values)
    values += anchors
    return np.maximum(values, 0, out=values)


def _words(data: bytes) -> np.ndarray:
    """The little-endian 64-bit words of ``data`` as native uint64 (no copy on x86/ARM)."""
    return np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=False)


@lru_cache(maxsize=16)
def _table(scale: float, size: int) -> _Table:
    """The entries and guide table for scale s (cached: a release reuses them)."""
    entries = _entries(scale, size)
    thresholds = np.full(size + 2, np.iinfo(np.uint64).max, dtype=np.uint64)
    thresholds[:size] = entries + np.uint64(TABLE_ERROR)
    bits = min(_GUIDE_BITS_MAX, max(_GUIDE_BITS_MIN, size.bit_length() + 4))
    width = np.uint64(1 << (HEAD_BITS - bits))
    starts = np.arange(1 << bits, dtype=np.uint64) * width
    # For h in bucket j, [j·W, (j + 1)·W): first(h) = #{k : thresholds ≤ h} lies between the
    # counts at the bucket's start and end. The bucket is decided (one answer, certain) when
    # the next threshold is ≥ (j + 1)·W + 2E: then none lies in the bucket and every h in it
    # has thresholds[first] ≥ h + 1 + 2E. Past the table (first = size) it is marked too.
    first = np.searchsorted(thresholds[:size], starts, side="right")
    last = np.searchsorted(thresholds[:size], starts + (width - np.uint64(1)), side="right")
    decided = (first < size) & (thresholds[first] >= starts + width + np.uint64(2 * TABLE_ERROR))
    answers = np.where(decided, first, 0).astype(np.int32)
    guide = np.concatenate([answers, -answers])
    guide[np.concatenate([~decided, ~decided])] = GUIDE_MARK
    lowest = np.where(last - first <= 2, first, -1).astype(np.int32)
    return _Table(entries, thresholds, guide, lowest, bits)


def _layout(scale: float) -> tuple[flint.arb, int, int]:
    """(c, m, n): x_k = (k + ½)·c, m entries an anchor (r = (m − 1)·c about 1/64; only r < 1
    matters for the bound) and the n terms that leave a series remainder 4.1·r^n/(1 − r) ≤
    2⁻⁶⁵ (checked in Arb)."""
    with _Prec(HEAD_BITS + _GUARD_BITS):
        step = 1 / (flint.arb(scale) * flint.arb(2).sqrt())
        per_anchor = max(1, math.floor(_SPAN * scale * math.sqrt(2)))
        reach = step * (per_anchor - 1)
        terms = 1
        if per_anchor > 1:
            while not _ERF_DISC_BOUND * reach**terms / (1 - reach) <= flint.arb(2) ** -65:
                terms += 1
    return step, per_anchor, terms


@dataclass(frozen=True)
class _Spans:
    """The table's anchors and series without its entries: T(k) = anchor_j + rint(Horner
    of span j's coefficients at u = k − j·m), within E of 2⁶³F(k) (``_series``), computed
    for the k a draw needs. Memory and build time do not grow with the scale."""

    per_anchor: int
    anchors: np.ndarray  # int64 (spans,)
    coefficients: np.ndarray  # float64 (n − 1, spans): b̂_1 … b̂_{n−1} of each span


@lru_cache(maxsize=16)
def _spans(scale: float, size: int) -> _Spans:
    """Every span's anchor and coefficients for k < size, each span's bound checked at its
    full width (u ≤ m − 1)."""
    step, per_anchor, terms = _layout(scale)
    if per_anchor < 2:
        raise ValueError("table-free draws need at least two entries a span")
    prec = HEAD_BITS + _GUARD_BITS
    anchors, rows = [], []
    for k0 in range(0, size, per_anchor):
        anchor, rounded, bound = _series(k0, step, terms, per_anchor - 1, prec)
        if not bound < TABLE_ERROR:
            raise ArithmeticError(f"span error bound {bound} exceeds {TABLE_ERROR}")
        anchors.append(anchor)
        rows.append(rounded)
    coefficients = np.ascontiguousarray(np.asarray(rows, dtype=np.float64).T)
    return _Spans(per_anchor, np.asarray(anchors, dtype=np.int64), coefficients)


def _entries(scale: float, size: int) -> np.ndarray:
    """T(k), k < size, each within TABLE_ERROR of 2⁶³·erf((k + ½)/(s√2)), non-decreasing.

    Written by hand: no library evaluates erf at many points with a certified error bound
    cheaply — Arb's erf is certified but costs about 20 µs a point (2 s a table), scipy's and
    numpy's float erf carry no proven bound, and mpmath is neither."""
    prec = HEAD_BITS + _GUARD_BITS
    top = (1 << HEAD_BITS) - 1
    step, per_anchor, terms = _layout(scale)
    entries = np.empty(size, dtype=np.int64)
    if per_anchor == 1:
        # Small tables: one Arb erf per entry.
        with _Prec(prec):
            two_bits = flint.arb(2) ** HEAD_BITS
            for k in range(size):
                value = ((flint.arb(k) + flint.arb(0.5)) * step).erf() * two_bits
                entries[k] = _fixed_point(value, HEAD_BITS)
        return entries.astype(np.uint64)
    offsets = np.arange(per_anchor, dtype=np.float64)  # u = k − k0, exact in float64
    for k0 in range(0, size, per_anchor):
        count = min(per_anchor, size - k0)
        anchor, increment, bound = _span(k0, step, terms, offsets[:count], prec)
        if not bound < TABLE_ERROR:
            raise ArithmeticError(f"table error bound {bound} exceeds {TABLE_ERROR}")
        # No overflow: the increment is capped where the sum would pass 2⁶³ − 1.
        raised = np.minimum(np.rint(increment).astype(np.int64), top - anchor)
        entries[k0 : k0 + count] = anchor + raised
    # Clamping into [0, 2⁶³ − 1] and the running maximum keep each entry within E of
    # 2⁶³F(k): F is increasing, so if T(j) > T(k) for j < k then 2⁶³F(k) > 2⁶³F(j) > T(j) − E
    # and T(j) < 2⁶³F(j) + E < 2⁶³F(k) + E.
    np.maximum(entries, 0, out=entries)
    np.maximum.accumulate(entries, out=entries)
    return entries.astype(np.uint64)


def _span(
    k0: int, step: flint.arb, terms: int, offsets: np.ndarray, prec: int
) -> tuple[int, np.ndarray, float]:
    """The anchor 2⁶³F(k0) (an integer within 2), the float64 increments 2⁶³(F(k0 + u) −
    F(k0)) at the ``offsets`` u, and a rigorous bound on the entries' error (``_series``)."""
    anchor, rounded, total = _series(k0, step, terms, int(offsets[-1]), prec)
    return anchor, _horner(rounded, offsets), total


def _horner(rounded: list[float] | np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Σ_{1≤i<n} b̂_i u^i at the float64 ``offsets`` u, by Horner in this exact order (the
    order ``_series``'s bound is about); ``rounded`` holds b̂_1 … b̂_{n−1} (rows of arrays
    gathered per offset, or floats)."""
    increment = np.zeros_like(offsets)
    for coefficient in reversed(rounded):
        increment *= offsets
        increment += coefficient
    increment *= offsets
    return increment


def _series(
    k0: int, step: flint.arb, terms: int, u_max: int, prec: int
) -> tuple[int, list[float], float]:
    """The anchor 2⁶³F(k0) (an integer within 2), the float64 coefficients b̂_i of the
    increments 2⁶³(F(k0 + u) − F(k0)) in u, and a rigorous bound on the error of an entry
    anchor + rint(``_horner``) for any integer 0 ≤ u ≤ ``u_max``.

    erf(x0 + c·u) = Σ_i b_i u^i (Arb's series: b_i as balls). With r = c·u_max ≤ 1/64 and
    Cauchy's estimate on the disc of radius 1 around x0 (|erf| ≤ 4.1 there), the terms from
    i = n on sum to at most 4.1·r^n/(1 − r) ≤ 2⁻⁶⁵. The increments are Σ_{1≤i<n} b̂_i u^i
    by Horner in float64, b̂_i = float(2⁶³b_i): |computed − exact| ≤ γ_{2n}·Σ|b̂_i|u^i
    (Higham, Accuracy and Stability of Numerical Algorithms, §5.1; u is an exact small
    integer) plus Σ|b̂_i − 2⁶³b_i|u^i for the coefficients, bounded by Arb at u_max."""
    with _Prec(prec, cap=terms):
        two_bits = flint.arb(2) ** HEAD_BITS
        x0 = (flint.arb(k0) + flint.arb(0.5)) * step
        coeffs = flint.arb_series([x0, step], prec=terms).erf().coeffs()
        if not 1 < len(coeffs) <= terms:
            raise ArithmeticError("Arb returned an unexpected series")
        anchor = _fixed_point(coeffs[0] * two_bits, HEAD_BITS)
        scaled = [c * two_bits for c in coeffs[1:]]
        rounded = [float(c.mid()) for c in scaled]
        gamma = flint.arb(2 * terms) * flint.arb(2) ** -53
        gamma = gamma / (1 - gamma)
        bound = flint.arb(0)
        power = flint.arb(1)
        for c, r in zip(scaled, rounded, strict=True):
            power = power * u_max
            bound += (gamma * abs(r) + (c - flint.arb(r)).abs_upper()) * power
        # The series' tail (≤ 2⁻⁶⁵·2⁶³), the anchor (< 2), rounding the increment (½).
        bound += flint.arb(0.25) + 2 + flint.arb(0.5)
        total = float(bound.upper()) * (1 + 2.0**-40)
    return anchor, rounded, total
