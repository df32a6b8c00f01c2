"""Exact Binomial(n, a/b) counts from the secure source, by inversion against rigorous bounds
on the CDF: the count half of Poisson subsampling drawn in O(1) per draw instead of n coins.

The law. Let V be uniform on [0, 1) and F(k) = P(K ≤ k) the Binomial(n, p) CDF, p = a/b
rational, F(−1) = 0, F(n) = 1. Inversion, K = min{k : V < F(k)}, has P(K = k) =
F(k) − F(k − 1): exactly the binomial law. V is read as bits, V ∈ [U·2⁻ᵐ, (U + 1)·2⁻ᵐ) after
m bits U, and K is returned only when every V in that window inverts to the same k, i.e. when
F(k − 1) ≤ U·2⁻ᵐ and (U + 1)·2⁻ᵐ ≤ F(k). F is never evaluated in floating point: each F(k) is
enclosed in integer bounds lo(k) ≤ F(k)·2^Q ≤ hi(k), and the test uses hi(k − 1) in place of
F(k − 1) and lo(k) in place of F(k), which can only make it stricter. So whenever the sampler
answers, its answer is the inversion's value of this V: the law is exactly binomial, however
loose the bounds (loose bounds only make the sampler read more bits). Draws use disjoint
keystream bytes, so they are independent.

The bounds. f(0) = ((b − a)/b)ⁿ by repeated squaring, then f(k + 1) = f(k)·(n − k)·a /
((k + 1)·(b − a)), all in binary floating point with P-bit integer mantissas: a lower chain
rounds every product and quotient down, an upper chain up (every factor is positive, so the
roundings compose into bounds). lo(k) and hi(k) are the sums over j ≤ k of the pmf bounds in
fixed point with Q = P bits, floored and ceiled, hi capped at 2^Q (F ≤ 1); F(n) = 1 exactly.
Relative widths grow like (n + k)·2⁻ᴾ: at P = 128 far below the 2⁻⁶⁴ of a word.

The draws. ``BinomialTable`` computes lo and hi once per public (n, a, b) at P = 128, over
k = 0, … until the mass left above is below 2⁻⁷², reduced to 64 bits (lo floored, hi ceiled).
Each draw reads one 64-bit word U (m = 64) and a vectorised search decides almost all:
the candidate is the first k with U < lo₆₄(k), accepted when hi₆₄(k − 1) ≤ U. A draw is left
undecided only when U falls within a few units of a boundary or beyond the table (probability
≈ 2·(table size)·2⁻⁶⁴ + 2⁻⁷²); ``_refine`` then reads 64 more bits of its V and recomputes
the bounds at twice the precision from k = 0 as far as the window needs (up to n, beyond
the table), compares them with the window in exact integers, and repeats (precision doubled,
64 more bits) until decided. The bounds converge to F
and V is almost surely no F(k), so it stops with probability 1, after one round almost always.
How many bytes are drawn depends on V and the public (n, a, b) only.
"""

from __future__ import annotations

import functools

import numpy as np

from dpcore.mechanisms.secure_random import SecureRandom

# Mantissa and fixed-point bits of the table's bounds.
PRECISION = 128
# The table stops once the mass above it is below this; draws beyond it are refined.
TAIL = 2.0**-72
_WORD = 64


def _round(mantissa: int, exponent: int, precision: int, up: bool) -> tuple[int, int]:
    """m·2^e cut to ``precision`` bits of mantissa, rounded down (or up with ``up``)."""
    drop = mantissa.bit_length() - precision
    if drop <= 0:
        return mantissa, exponent
    kept = mantissa >> drop
    if up and (kept << drop) != mantissa:
        kept += 1
    return kept, exponent + drop


def _times(
    value: tuple[int, int], numerator: int, denominator: int, precision: int, up: bool
) -> tuple[int, int]:
    """value·numerator/denominator, rounded down (or up) to ``precision`` bits: the quotient
    is taken with enough extra bits that only the final cut rounds (each rounding is in the
    same direction, so the result is a bound either way)."""
    mantissa, exponent = value
    shift = precision + denominator.bit_length()
    quotient, remainder = divmod((mantissa * numerator) << shift, denominator)
    if up and remainder:
        quotient += 1
    return _round(quotient, exponent - shift, precision, up)


def _power(value: tuple[int, int], power: int, precision: int, up: bool) -> tuple[int, int]:
    """valueᵖᵒʷᵉʳ by repeated squaring, each product rounded in the same direction."""
    result = (1, 0)
    while power:
        if power & 1:
            result = _round(result[0] * value[0], result[1] + value[1], precision, up)
        power >>= 1
        if power:
            value = _round(value[0] * value[0], 2 * value[1], precision, up)
    return result


def _fixed(value: tuple[int, int], bits: int, up: bool) -> int:
    """⌊m·2^e·2^bits⌋ (or ⌈·⌉ with ``up``)."""
    mantissa, exponent = value
    shift = exponent + bits
    if shift >= 0:
        return mantissa << shift
    out = mantissa >> -shift
    if up and (out << -shift) != mantissa:
        out += 1
    return out


def _rescale(value: int, precision: int, up: bool) -> int:
    """value·2^(64 − precision), floored (or ceiled with ``up``)."""
    return _fixed((value, -precision), _WORD, up)


def cdf_bounds(
    trials: int, numerator: int, denominator: int, precision: int, stop: int | None = None
) -> tuple[list[int], list[int]]:
    """Integer lo(k) ≤ F(k)·2^precision ≤ hi(k) for k = 0, 1, …: up to ``trials``, or
    (with ``stop``) to the first k with lo(k) ≥ ``stop``; F(trials) = 1 is exact. 0 < p < 1."""
    one = 1 << precision
    rest = denominator - numerator
    shift = precision + denominator.bit_length()
    base_lo = _round((rest << shift) // denominator, -shift, precision, False)
    base_hi = _round(-((-rest << shift) // denominator), -shift, precision, True)
    pmf_lo = _power(base_lo, trials, precision, False)
    pmf_hi = _power(base_hi, trials, precision, True)
    lows: list[int] = []
    highs: list[int] = []
    low = high = 0
    for k in range(trials + 1):
        if k:
            step = ((trials - k + 1) * numerator, k * rest)
            pmf_lo = _times(pmf_lo, *step, precision, False)
            pmf_hi = _times(pmf_hi, *step, precision, True)
        low += _fixed(pmf_lo, precision, False)
        high = min(one, high + _fixed(pmf_hi, precision, True))
        if k == trials:
            low = high = one
        lows.append(low)
        highs.append(high)
        if stop is not None and low >= stop:
            break
    return lows, highs


class BinomialTable:
    """Draws of Binomial(``trials``, ``numerator``/``denominator``) (module docstring).
    ``precision`` and ``tail`` are the table's; tests shrink them to send draws to
    ``_refine`` (the law does not depend on them)."""

    def __init__(
        self,
        trials: int,
        numerator: int,
        denominator: int,
        *,
        precision: int = PRECISION,
        tail: float = TAIL,
    ) -> None:
        if trials < 0 or denominator < 1 or not 0 <= numerator <= denominator:
            raise ValueError("need trials >= 0 and 0 <= numerator <= denominator, denominator >= 1")
        if precision < 1:
            raise ValueError("precision must be positive")
        self.trials, self.numerator, self.denominator = trials, numerator, denominator
        self.precision = precision
        self.lower = self.upper_minus_one = np.empty(0, np.uint64)
        if 0 < numerator < denominator and trials:
            stop = (1 << precision) - int(tail * 2.0**precision)
            lows, highs = cdf_bounds(trials, numerator, denominator, precision, stop)
            top = (1 << _WORD) - 1
            # 64-bit bounds: lo floored (and kept below 2⁶⁴: smaller is still a lower bound);
            # hi ceiled, stored minus one (hi ≥ 1 since f(0) > 0) so that 2⁶⁴ fits.
            self.lower = np.array(
                [min(_rescale(lo, precision, False), top) for lo in lows], dtype=np.uint64
            )
            self.upper_minus_one = np.array(
                [_rescale(hi, precision, True) - 1 for hi in highs], dtype=np.uint64
            )

    def draw(self, count: int, *, generator: SecureRandom) -> np.ndarray:
        """``count`` independent draws, int64."""
        if self.numerator == 0 or self.trials == 0:
            return np.zeros(count, dtype=np.int64)
        if self.numerator == self.denominator:
            return np.full(count, self.trials, dtype=np.int64)
        words = generator.words(count, np.uint64)
        k = np.searchsorted(self.lower, words, side="right")  # first k with U < lo(k)
        inside = k < self.lower.size
        previous = self.upper_minus_one[np.maximum(k - 1, 0)]
        decided = inside & ((k == 0) | (previous < words))
        out = k.astype(np.int64)
        for i in np.flatnonzero(~decided):
            out[i] = self._refine(int(words[i]), generator)
        return out

    def _refine(self, prefix: int, generator: SecureRandom) -> int:
        """One undecided draw: more bits of its V and tighter bounds until one k is certain."""
        bits = _WORD
        precision = self.precision
        while True:
            prefix = (prefix << _WORD) | int(generator.words(1, np.uint64)[0])
            bits += _WORD
            precision *= 2
            # V ∈ [prefix, prefix + 1)·2^−bits against F(k) ∈ [lo, hi]·2^−precision, in
            # integers. The candidate is the first k whose lo is at or above the window's
            # end (k = n at the latest: lo(n) = 2^precision); no later k can be certain, as
            # hi(k − 1) ≥ lo(candidate) lies above the window's start.
            end = -(-((prefix + 1) << precision) >> bits)
            lows, highs = cdf_bounds(
                self.trials, self.numerator, self.denominator, precision, stop=end
            )
            k = len(lows) - 1
            if k == 0 or highs[k - 1] << bits <= prefix << precision:
                return k


@functools.lru_cache(maxsize=32)
def table(trials: int, numerator: int, denominator: int) -> BinomialTable:
    """The table for public (n, a, b), built once per process."""
    return BinomialTable(trials, numerator, denominator)


def binomial(
    trials: int, numerator: int, denominator: int, count: int, *, generator: SecureRandom
) -> np.ndarray:
    """``count`` independent Binomial(``trials``, ``numerator``/``denominator``) draws, exact
    (module docstring), as int64; ``trials``, ``numerator`` and ``denominator`` must be
    public: the table is cached on them."""
    return table(trials, numerator, denominator).draw(count, generator=generator)
