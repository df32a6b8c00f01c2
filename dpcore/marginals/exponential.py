"""The exponential mechanism on integer scores, drawn exactly from a caller's secure stream.

A draw picks candidate i with probability ∝ exp(γ·sᵢ) for integer scores sᵢ whose change
between neighbouring datasets is at most Δ (the caller's sensitivity) and a rational
γ ≤ ε/(2Δ) (``selection_rate``: ε read exactly from its float, divided, rounded down to a
multiple of 2⁻⁴⁸, so the mechanism is never less private than charged). Such a draw is ε-DP
and ε-bounded-range (the log-ratio of two candidates' probabilities moves by at most 2γΔ ≤ ε),
hence ε²/8-zCDP (Cesar, Rogers 2021, Lemma 3.2).

The draw is rejection sampling: proposals uniform over the candidates, each accepted with
probability exp(−γ·(s_max − sᵢ)), decided by comparing a uniform from the secure stream with
Arb's certified bounds on that probability (python-flint), reading further bits only when the
bounds cannot decide. The first accepted proposal has exactly the exponential mechanism's law,
so no approximation is charged to δ. Proposals come in fixed batches, all drawn and tested, so
the work does not depend on the scores except on an event of negligible probability
(``exponential_mechanism``). Written here because no library offers an exponential mechanism
on a caller's secure stream with an exact law and data-independent work.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

import flint
import numpy as np

from dpcore.mechanisms.secure_random import SecureRandom

_RATE_BITS = 48
# Proposals per candidate in one batch of the rejection sampler (``exponential_mechanism``).
TRIALS = 48
_TOP = 2**64 - 1


@contextlib.contextmanager
def _precision(bits: int) -> Iterator[None]:
    before = flint.ctx.prec
    flint.ctx.prec = bits
    try:
        yield
    finally:
        flint.ctx.prec = before


def selection_rate(epsilon: float, sensitivity: int) -> Fraction:
    """γ: the largest multiple of 2⁻⁴⁸ with 2γ·``sensitivity`` ≤ ``epsilon`` (exactly)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the selection epsilon must be finite and > 0, got {epsilon}")
    if sensitivity < 1:
        raise ValueError(f"the score sensitivity must be a positive integer, got {sensitivity}")
    exact = Fraction(epsilon) / (2 * sensitivity)
    return Fraction(math.floor(exact * 2**_RATE_BITS), 2**_RATE_BITS)


def _integer(ball: flint.arb) -> int:
    value = ball.unique_fmpz()
    if value is None:  # floor and ceil of a finite ball are exact integers
        raise ArithmeticError("no unique integer")
    return int(value)


def _floor(ball: flint.arb) -> int:
    """An integer ≤ every point of ``ball``."""
    return _integer(ball.lower().floor())


def _ceil(ball: flint.arb) -> int:
    """An integer ≥ every point of ``ball``."""
    return _integer(ball.upper().ceil())


def acceptance_bounds(gaps: Sequence[int], rate: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """For each gap g, integers L ≤ 2⁶⁴·exp(−rate·g) < U (Arb's certified ball at 128 bits;
    U − L ≤ 2). A gap of 0 (probability 1) is L = U = 2⁶⁴ − 1 with ``always``."""
    lower = np.empty(len(gaps), dtype=np.uint64)
    upper = np.empty(len(gaps), dtype=np.uint64)
    with _precision(128):
        scale = flint.arb(2) ** 64
        for i, gap in enumerate(gaps):
            if gap == 0:
                lower[i] = upper[i] = _TOP
                continue
            x = rate * gap
            ball = flint.arb(flint.fmpq(x.numerator, x.denominator)).neg().exp() * scale
            lower[i] = min(_TOP, _floor(ball))
            upper[i] = min(_TOP, _ceil(ball))
    return lower, upper


def _accepts(x: Fraction, head: int, source: SecureRandom) -> bool:
    """Whether V < exp(−x) for a uniform V whose first 64 bits are ``head``: further words of
    V are read, and exp(−x) computed more finely, until the comparison is certain (exp(−x)
    is irrational for rational x > 0, so this ends with probability 1)."""
    bits = 64
    while True:
        head = (head << 64) | int(source.words(1)[0])
        bits += 64
        with _precision(bits + 64):
            p = flint.arb(flint.fmpq(x.numerator, x.denominator)).neg().exp()
            p = p * flint.arb(2) ** bits
            if head + 1 <= _floor(p):
                return True
            if head >= _ceil(p):
                return False


def exponential_mechanism(
    scores: np.ndarray, rate: Fraction, source: SecureRandom, trials: int = TRIALS
) -> int:
    """An index i with probability exactly exp(rate·sᵢ)/Σⱼ exp(rate·sⱼ) (integer scores).

    Rejection sampling in batches of ``trials`` × m proposals, every proposal of a batch
    drawn and tested whether or not an earlier one was accepted: the first accepted proposal
    is returned. Each proposal is a uniform index and a uniform 64-bit word u, accepted when
    u < L of its gap, rejected when u ≥ U, and only in between (probability ≤ 2⁻⁶³) compared
    exactly by reading further words (``_accepts``). The first accepted proposal of an
    unbounded sequence of independent proposals has the exponential mechanism's law; a batch
    holds one with probability ≥ 1 − (1 − 1/m)^(trials·m) ≥ 1 − e^(−trials) (the best pair is
    accepted whenever proposed), so the work — the words read and the comparisons made —
    does not depend on the scores except on an event of probability below e^(−trials) plus
    trials·m·2⁻⁶³."""
    values = np.asarray(scores, dtype=np.int64)
    m = len(values)
    if m == 0:
        raise ValueError("no candidates")
    gaps = [int(g) for g in values.max() - values]
    lower, upper = acceptance_bounds(gaps, rate)
    always = np.asarray([g == 0 or rate == 0 for g in gaps])
    while True:
        index = source.integers(m, trials * m)
        words = source.words(trials * m)
        accepted = always[index] | (words < lower[index])
        undecided = ~accepted & (words < upper[index])
        for j in np.flatnonzero(accepted | undecided):
            i = int(index[j])
            if accepted[j] or _accepts(rate * gaps[i], int(words[j]), source):
                return i
