"""AIM's candidates and their scores.

Workload: every pair of attributes, weight 1. Candidates: its downward closure (every pair
and every single attribute), each with AIM's weight w_r = Σ_{s in the workload} |r ∩ s|
(public: k − 1 for an attribute, 2k − 2 for a pair).

A candidate's score, in integers: w_r·(‖H·M_r − round(H·M̂_r)‖₁ − round(H·√(2/π)·σ·n_r)),
M_r its histogram on the records, M̂_r the current model's marginal (post-processing of
released values), n_r its cells and √(2/π)·σ·n_r the L1 error one measurement at σ is
expected to leave (public): AIM's "how much better would measuring r make the model". H is
``SCORE_GRID``. Replacing one record moves H·M_r by H in at most two cells, so a score moves
by at most w_r·2H ≤ ``sensitivity`` = 2H·max w, exactly (integers: no floating-point error).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from dpcore.marginals import histograms
from dpcore.marginals.inference import Growth, JunctionTree
from dpcore.mechanisms.aim.accounting import MARGINAL_L1_SENSITIVITY

SCORE_GRID = 64

Clique = tuple[int, ...]


def expected_error(sigma: float, cells: int) -> float:
    """E‖N(0, σ²I_cells)‖₁: the error one measurement at σ leaves in a marginal of ``cells``."""
    return math.sqrt(2.0 / math.pi) * sigma * cells


def workload_weights(attributes: int) -> dict[Clique, int]:
    """Every candidate (pairs, then single attributes) and its weight."""
    pairs = list(itertools.combinations(range(attributes), 2))
    weights: dict[Clique, int] = {pair: 2 + 2 * (attributes - 2) for pair in pairs}
    weights.update({(a,): attributes - 1 for a in range(attributes)})
    return weights


class Candidates:
    """The candidates' weights and their histograms on the records (read once)."""

    def __init__(self, codes: np.ndarray, sizes: list[int]):
        self.sizes = sizes
        self.weights = workload_weights(len(sizes))
        self.cliques = list(self.weights)
        self._counts = {c: histograms.counts(codes, c, sizes) for c in self.cliques}
        self.sensitivity = MARGINAL_L1_SENSITIVITY * SCORE_GRID * max(self.weights.values())

    def counts(self, clique: Clique) -> np.ndarray:
        return self._counts[clique]

    def within(self, measured: list[Clique], size_limit: float) -> list[Clique]:
        """The candidates whose measurement keeps the model within ``size_limit`` MiB (AIM's
        rule, on ``inference.Growth``'s bound of the grown model's junction tree): those
        inside a clique of the current tree cost nothing more. A function of the cliques
        measured so far (released) only."""
        growth = Growth(self.sizes, measured)
        return [c for c in self.cliques if growth.bound(c) <= size_limit or growth.inside(c)]

    def scores(self, cliques: list[Clique], tree: JunctionTree, sigma: float) -> np.ndarray:
        out = np.empty(len(cliques), dtype=np.int64)
        for i, clique in enumerate(cliques):
            estimate = np.rint(SCORE_GRID * tree.marginal(clique)).astype(np.int64)
            error = int(np.abs(SCORE_GRID * self._counts[clique].astype(np.int64) - estimate).sum())
            penalty = round(SCORE_GRID * expected_error(sigma, estimate.size))
            out[i] = self.weights[clique] * (error - penalty)
        return out
