"""The marginal-based mechanisms' shared parts: exact inference on a graphical model against a
brute-force joint, and records drawn from it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from dpcore.marginals.inference import JunctionTree

pytestmark = pytest.mark.unit

SIZES = [3, 2, 4, 2, 3]
# A loop (0–1–2–0) the junction tree must triangulate, a chain off it and a triple.
CLIQUES = [(0, 1), (1, 2), (0, 2), (2, 3), (2, 3, 4)]


def _model(seed: int) -> tuple[dict[tuple[int, ...], np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    potentials = {c: rng.normal(0, 1.5, [SIZES[a] for a in c]) for c in CLIQUES}
    joint = np.zeros(SIZES)
    for cell in itertools.product(*(range(s) for s in SIZES)):
        joint[cell] = np.exp(sum(t[tuple(cell[a] for a in c)] for c, t in potentials.items()))
    return potentials, joint / joint.sum()


def _brute(joint: np.ndarray, attrs: tuple[int, ...]) -> np.ndarray:
    axes = tuple(a for a in range(joint.ndim) if a not in attrs)
    kept = joint.sum(axis=axes)
    return np.transpose(kept, [sorted(attrs).index(a) for a in attrs])


@pytest.mark.parametrize("seed", [0, 1])
def test_every_marginal_matches_the_brute_force_joint(seed: int) -> None:
    potentials, joint = _model(seed)
    tree = JunctionTree(SIZES, potentials, total=50.0)
    for size in (1, 2, 3):
        for attrs in itertools.permutations(range(len(SIZES)), size):
            np.testing.assert_allclose(tree.marginal(attrs), 50.0 * _brute(joint, attrs), atol=1e-9)


def test_attributes_no_clique_covers_are_uniform() -> None:
    tree = JunctionTree([2, 3], {(0,): np.log(np.array([1.0, 3.0]))}, total=8.0)
    np.testing.assert_allclose(tree.marginal((1, 0)), [[1, 3], [1, 3], [1, 3]] / np.array(1.5))


def test_records_are_drawn_from_the_model() -> None:
    potentials, joint = _model(3)
    tree = JunctionTree(SIZES, potentials, total=1.0)
    codes = tree.sample(40_000, np.random.default_rng(0))
    cells = np.ravel_multi_index(codes.T, SIZES)
    counts = np.bincount(cells, minlength=joint.size)
    expected = joint.ravel() * len(codes)
    keep = expected > 5
    assert (
        stats.chisquare(
            counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()
        ).pvalue
        > 1e-4
    )
    # A model with one clique's potential dropped is told apart by the same draws.
    wrong = JunctionTree(SIZES, {c: t for c, t in potentials.items() if c != (0, 2)}, total=1.0)
    other = np.array([wrong.marginal(tuple(range(5)))]).ravel()
    assert (
        stats.chisquare(
            counts[keep], (other.ravel()[keep] / other.ravel()[keep].sum()) * counts[keep].sum()
        ).pvalue
        < 1e-6
    )


def test_growth_bounds_a_chain_closed_into_a_loop() -> None:
    from dpcore.marginals.inference import Growth

    sizes = [3, 4, 5, 2]
    growth = Growth(sizes, [(0, 1), (1, 2), (3,)])
    cells = 3 * 4 + 4 * 5 + 2
    assert growth.size == pytest.approx(cells * 8 / 2**20)
    assert growth.inside((1, 2)) and growth.bound((1, 2)) == growth.size
    # Closing 0–1–2 into a loop: 0 joins (1, 2) (or 2 joins (0, 1)), the cheaper of the two.
    assert growth.bound((0, 2)) == pytest.approx((cells + min(4 * 5 * 2, 3 * 4 * 4)) * 8 / 2**20)
    # The model grown by (0, 2) is one clique (0, 1, 2) beside (3,): within the bound.
    assert Growth(sizes, [(0, 1), (1, 2), (3,), (0, 2)]).size <= growth.bound((0, 2))
