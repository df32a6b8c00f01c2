"""An exact sampler of the rounded Gaussian K = round(N/g), N ~ N(0, σ²), from secure bits.

Why this distribution: on the lattice gℤ, x_l + g·round(N/g) = g·round((x_l + N)/g) for a
lattice point x_l, so the release is a post-processing of the plain Gaussian mechanism on x_l.
Every accountant written for the continuous Gaussian (RDP, PLD, subsampling, GDP) therefore
holds unchanged, with the sensitivity of x ↦ x_l (see ``dpcore.mechanisms.noise``).

How it samples, in lattice units (s = σ/g): |K| = #{k ≥ 0 : F(k) ≤ V} with
F(k) = P(|K| ≤ k) = erf((k + ½)/(s√2)) and V uniform on [0, 1), then a uniform sign. V is
read lazily from the OS CSPRNG: the first 128 bits decide almost every draw against a table
of ⌊2¹²⁸F(k)⌋ (each entry within 2 of 2¹²⁸F(k), from Arb's rigorous ball arithmetic);
a draw that lands within 2 of an entry (probability about 2⁻⁶² per draw) reads 64 more bits
at a time and compares against F(k) recomputed at matching precision, until it is decided.
So the sampler is exact — its output law is the rounded Gaussian, with no approximation to
charge to δ — assuming only that the CSPRNG's bits are uniform. Draws beyond the table
(probability < 2⁻¹³⁰) take the same exact path.

Written here rather than taken from a library: the libraries that offer a secure discrete
Gaussian (e.g. the Canonne–Kamath–Steinke sampler) sample exp(−k²/2s²) weights, whose
subsampled privacy curves are not the Gaussian's; this distribution keeps every Gaussian
accountant valid by post-processing.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from functools import lru_cache

import flint
import numpy as np

RandomBytes = Callable[[int], bytes]

_WORD = 64
_HEAD_BITS = 128
# The table stops where the folded tail P(|K| > k) falls below 2⁻¹³⁰: |N| > 13.3σ.
TAIL_SIGMAS = 13.3
_GUARD_BITS = 64


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
    """Entries of the table for scale s (its build time grows linearly with it)."""
    return math.ceil(TAIL_SIGMAS * scale) + 1


# Arb's working precision is one process-wide setting: jobs running in threads (embedded
# mode) must not change it under each other's feet.
_FLINT_LOCK = threading.RLock()


class _Prec:
    """Arb's working precision for a block (held under the lock), restored afterwards."""

    def __init__(self, prec: int) -> None:
        self.prec = prec

    def __enter__(self) -> None:
        _FLINT_LOCK.acquire()
        self.saved = flint.ctx.prec
        flint.ctx.prec = self.prec

    def __exit__(self, *exc: object) -> None:
        flint.ctx.prec = self.saved
        _FLINT_LOCK.release()


class RoundedGaussian:
    """Sampler of round(N(0, s²)) on ℤ (s in lattice units), exact given uniform bits."""

    def __init__(self, scale: float) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError("the scale must be finite and positive")
        self.scale = float(scale)
        self.size = table_size(self.scale)
        self._hi, self._lo = _table(self.scale, self.size)

    def _cdf_bits(self, k: int, bits: int) -> int:
        """⌊2^bits·F(k)⌋ within 2, for any k ≥ 0 and precision."""
        return _erf_bits(k + 0.5, self.scale, bits)

    def sample(self, count: int, *, random_bytes: RandomBytes = os.urandom) -> np.ndarray:
        """``count`` independent draws as int64."""
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        words = np.frombuffer(random_bytes(16 * count), dtype="<u8").reshape(count, 2)
        u_hi, u_lo = words[:, 0].copy(), words[:, 1].copy()
        signs = np.unpackbits(np.frombuffer(random_bytes(-(-count // 8)), dtype=np.uint8))
        below = np.maximum(u_hi, np.uint64(1)) - np.uint64(1)
        above = np.minimum(u_hi, np.uint64(2**64 - 2)) + np.uint64(1)
        # Entries with head word ≤ u_hi − 2 are below V for sure, those ≥ u_hi + 2 above it.
        first = np.searchsorted(self._hi, below, side="left")
        beyond = first >= self.size
        undecided = ~beyond & (self._hi[np.minimum(first, self.size - 1)] <= above)
        magnitude = first.astype(np.int64)
        # A head word within 1 of the draw's, or a draw beyond the table, is decided exactly.
        for i in np.flatnonzero(undecided | beyond):
            u = (int(u_hi[i]) << _WORD) | int(u_lo[i])
            magnitude[i] = self._exact_magnitude(u, int(first[i]), random_bytes)
        negative = signs[:count].astype(bool)
        return np.where(negative, -magnitude, magnitude)

    def _exact_magnitude(self, head: int, start: int, random_bytes: RandomBytes) -> int:
        """#{k : F(k) ≤ V} for V = 0.head…, reading more bits of V only when needed."""
        extra: list[int] = []
        k = start
        while self._at_most(k, head, extra, random_bytes):
            k += 1
        return k

    def _at_most(self, k: int, head: int, extra: list[int], random_bytes: RandomBytes) -> bool:
        """Whether F(k) ≤ V, deciding with as many bits of V as it takes."""
        rounds = 0
        while True:
            bits = _HEAD_BITS + _WORD * rounds
            while len(extra) < rounds:
                extra.append(int.from_bytes(random_bytes(8), "little"))
            prefix = head
            for word in extra[:rounds]:
                prefix = (prefix << _WORD) | word
            if rounds == 0 and k < self.size:
                table = (int(self._hi[k]) << _WORD) | int(self._lo[k])
            else:
                table = self._cdf_bits(k, bits)
            # V ∈ [prefix, prefix + 1)·2^-bits and 2^bits·F(k) ∈ (table − 2, table + 2).
            if prefix >= table + 2:
                return True
            if prefix + 1 <= table - 2:
                return False
            rounds += 1


@lru_cache(maxsize=16)
def _table(scale: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Head and tail words of ⌊2¹²⁸F(k)⌋, k = 0 … size − 1 (cached: a release reuses it)."""
    hi = np.empty(size, dtype=np.uint64)
    lo = np.empty(size, dtype=np.uint64)
    prec = _HEAD_BITS + _GUARD_BITS
    mask = (1 << _WORD) - 1
    with _Prec(prec):
        root = flint.arb(scale) * flint.arb(2).sqrt()
        two_bits = flint.arb(2) ** _HEAD_BITS
        for k in range(size):
            value = _fixed_point(
                ((flint.arb(k) + flint.arb(0.5)) / root).erf() * two_bits, _HEAD_BITS
            )
            hi[k] = value >> _WORD
            lo[k] = value & mask
    return hi, lo
