"""MST's selection: which pairs of attributes to measure, by the exponential mechanism, drawn
exactly from secure bits.

Scores are integers (``pair_scores``): H·‖M_ab − M̂_ab‖₁ with H = ``SCORE_GRID``, M_ab the
pair's histogram and M̂_ab the independent estimate from the noisy one-way marginals rounded
to the grid 1/H (post-processing of released values). Replacing one record moves H·M_ab by H
in at most two cells, so a score moves by at most ``SCORE_SENSITIVITY`` = 2H, exactly: the
integers carry no floating-point error for the analysis to cover.

A round draws a pair by the exponential mechanism on those scores
(``dpcore.marginals.exponential``: exact law from the secure stream, data-independent work),
at a rate γ ≤ ε₀/(2·2H).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from dpcore.marginals import exponential
from dpcore.marginals.exponential import exponential_mechanism
from dpcore.mechanisms.mst.accounting import PAIR_L1_SENSITIVITY
from dpcore.mechanisms.secure_random import SecureRandom

SCORE_GRID = 64
SCORE_SENSITIVITY = int(PAIR_L1_SENSITIVITY) * SCORE_GRID


def selection_rate(epsilon: float) -> Fraction:
    """γ for MST's pair scores: 2γ·SCORE_SENSITIVITY ≤ ``epsilon`` exactly."""
    return exponential.selection_rate(epsilon, SCORE_SENSITIVITY)


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
