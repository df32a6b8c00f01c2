"""MST's selection: which pairs of attributes to measure, by the exponential mechanism, drawn
exactly from secure bits.

Scores are integers (``pair_scores``): H·‖M_ab − M̂_ab‖₁ with H = ``SCORE_GRID``, M_ab the
pair's histogram and M̂_ab the independent estimate from the noisy one-way marginals rounded
to the grid 1/H (post-processing of released values). Replacing one record moves H·M_ab by H
in at most two cells, so a score moves by at most ``SCORE_SENSITIVITY`` = 2H, exactly: the
integers carry no floating-point error for the analysis to cover.

A round draws pair i with probability ∝ exp(γ·sᵢ) for a rational γ ≤ ε₀/(2·2H)
(``selection_rate``: ε₀ read exactly from its float, divided, rounded down to a multiple of
2⁻⁴⁸, so the mechanism is never less private than charged). The draw is rejection sampling:
proposals uniform over the pairs, each accepted with probability exp(−γ·(s_max − sᵢ)),
decided by comparing a uniform from the secure stream with Arb's certified bounds on that
probability (python-flint), reading further bits only when the bounds cannot decide. The
first accepted proposal has exactly the exponential mechanism's law, so no approximation is
charged to δ. Proposals come in fixed batches, all drawn and tested, so the work does not
depend on the scores except on an event of negligible probability (``exponential_mechanism``).
Written here because no library offers an exponential mechanism on a caller's secure stream
with an exact law and data-independent work.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction

import flint
import numpy as np

from dpcore.mechanisms.mst.accounting import PAIR_L1_SENSITIVITY
from dpcore.mechanisms.secure_random import SecureRandom

SCORE_GRID = 64
SCORE_SENSITIVITY = int(PAIR_L1_SENSITIVITY) * SCORE_GRID
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


def selection_rate(epsilon: float) -> Fraction:
    """γ: the largest multiple of 2⁻⁴⁸ with 2γ·SCORE_SENSITIVITY ≤ ``epsilon`` (exactly)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the selection epsilon must be finite and > 0, got {epsilon}")
    exact = Fraction(epsilon) / (2 * SCORE_SENSITIVITY)
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


def independent_estimate(counts_a: np.ndarray, counts_b: np.ndarray, n: int) -> np.ndarray:
    """n·p_a ⊗ p_b on the grid 1/H, in grid units (int64): p the noisy counts with negatives
    set to 0, normalised (uniform where nothing is left)."""
    grid = []
    for counts in (counts_a, counts_b):
        p = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
        total = p.sum()
        grid.append(p / total if total > 0 else np.full(p.shape, 1.0 / p.size))
    return np.rint(SCORE_GRID * n * np.outer(grid[0], grid[1])).astype(np.int64)


def pair_scores(
    codes: np.ndarray,
    sizes: Sequence[int],
    noisy_one_way: Sequence[np.ndarray],
    pairs: Sequence[tuple[int, int]],
) -> np.ndarray:
    """Each pair's integer score H·‖M_ab − M̂_ab‖₁ (module docstring); ``codes`` the records'
    attribute values (n, k) and ``noisy_one_way`` the released one-way counts."""
    n = len(codes)
    scores = np.empty(len(pairs), dtype=np.int64)
    for i, (a, b) in enumerate(pairs):
        joint = np.bincount(codes[:, a] * sizes[b] + codes[:, b], minlength=sizes[a] * sizes[b])
        estimate = independent_estimate(noisy_one_way[a], noisy_one_way[b], n).ravel()
        scores[i] = int(np.abs(SCORE_GRID * joint.astype(np.int64) - estimate).sum())
    return scores


def spanning_tree(
    scores: np.ndarray,
    pairs: Sequence[tuple[int, int]],
    attributes: int,
    rate: Fraction,
    source: SecureRandom,
    report: Callable[[int, int], None] | None = None,
) -> list[tuple[int, int]]:
    """Kruskal's order with a draw per round: attributes − 1 rounds, each choosing among the
    pairs that join two different trees of the forest so far."""
    parent = list(range(attributes))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    chosen: list[tuple[int, int]] = []
    for _ in range(attributes - 1):
        open_pairs = [i for i, (a, b) in enumerate(pairs) if root(a) != root(b)]
        pick = open_pairs[exponential_mechanism(scores[open_pairs], rate, source)]
        a, b = pairs[pick]
        parent[root(a)] = root(b)
        chosen.append((a, b))
        if report is not None:
            report(len(chosen), attributes - 1)
    return chosen
