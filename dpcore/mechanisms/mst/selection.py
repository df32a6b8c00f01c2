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
a candidate uniform over the pairs, accepted with probability exp(−γ·(s_max − sᵢ)) by the
exact Bernoulli(exp(−x)) sampler for rational x of Canonne, Kamath and Steinke (2020, Alg. 1),
whose coins are exact rational Bernoullis of the release's secure source. The accepted index
has exactly the exponential mechanism's law, so no approximation is charged to δ. Written
here because no library offers an exponential mechanism on a caller's secure stream with an
exact law; it is a dozen lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpcore.mechanisms.mst.accounting import PAIR_L1_SENSITIVITY
from dpcore.mechanisms.secure_random import SecureRandom

SCORE_GRID = 64
SCORE_SENSITIVITY = int(PAIR_L1_SENSITIVITY) * SCORE_GRID
_RATE_BITS = 48


def selection_rate(epsilon: float) -> Fraction:
    """γ: the largest multiple of 2⁻⁴⁸ with 2γ·SCORE_SENSITIVITY ≤ ``epsilon`` (exactly)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the selection epsilon must be finite and > 0, got {epsilon}")
    exact = Fraction(epsilon) / (2 * SCORE_SENSITIVITY)
    return Fraction(math.floor(exact * 2**_RATE_BITS), 2**_RATE_BITS)


def _coin(numerator: int, denominator: int, source: SecureRandom) -> bool:
    return bool(source.bernoulli(numerator, denominator, (1,))[0])


def bernoulli_exp(x: Fraction, source: SecureRandom) -> bool:
    """True with probability exactly exp(−x), for rational x ≥ 0."""
    if x < 0:
        raise ValueError("x must be >= 0")
    whole = x.numerator // x.denominator
    for _ in range(whole):
        if not _bernoulli_exp_unit(Fraction(1), source):
            return False
    return _bernoulli_exp_unit(x - whole, source)


def _bernoulli_exp_unit(x: Fraction, source: SecureRandom) -> bool:
    """exp(−x) for x in [0, 1]: draw A_k ~ Bernoulli(x/k) for k = 1, 2, … until one is 0;
    P(first 0 at an odd k) = Σ_j (−x)^j/j! = exp(−x)."""
    k = 1
    while _coin(x.numerator, x.denominator * k, source):
        k += 1
    return k % 2 == 1


def exponential_mechanism(scores: np.ndarray, rate: Fraction, source: SecureRandom) -> int:
    """An index i with probability exactly exp(rate·sᵢ)/Σⱼ exp(rate·sⱼ) (integer scores)."""
    values = [int(s) for s in np.asarray(scores, dtype=np.int64)]
    if not values:
        raise ValueError("no candidates")
    best = max(values)
    while True:
        i = int(source.integers(len(values), 1)[0])
        if bernoulli_exp(rate * (best - values[i]), source):
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
    report: object = None,
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
        if callable(report):
            report(len(chosen), attributes - 1)
    return chosen
