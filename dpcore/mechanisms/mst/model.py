"""MST's post-processing: the noisy marginals into a graphical model (Private-PGM, the ``mbi``
library's mirror descent), and records drawn from it. Reads released values and public facts
only.

- ``compress``: MST's domain compression. An attribute's values whose noisy one-way count is
  below 3σ₁ merge into one value (when more than one is), and its one-way measurement is
  re-expressed on the merged domain (``mbi.LinearMeasurement.compress``).
- ``estimate``: the model whose marginals best fit every noisy measurement (known total n).
- ``sample``: the model's graph is the selected spanning tree, so records are drawn exactly
  by ancestral sampling: the root attribute from its marginal, each other attribute from its
  conditional given its parent's drawn value (written here: a few lines of numpy on a tree,
  where ``mbi``'s samplers use a global or JAX random state); a merged value becomes one of
  its original values, uniformly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from dpcore.categorical import category_proportions

# Private-PGM's estimates stall in float32 on large totals (its own warning): JAX in float64,
# set before mbi is imported.
jax.config.update("jax_enable_x64", True)
# mbi compiles many small programs: a persistent cache only costs disk (its own advice).
jax.config.update("jax_enable_compilation_cache", False)

import mbi  # noqa: E402
from mbi import Domain, LinearMeasurement  # noqa: E402

SUPPORT_STDS = 3.0
TOL = 1e-5


def _name(a: int) -> str:
    return f"a{a}"


@dataclass(frozen=True)
class Compressed:
    """Each attribute's map from its values to merged values, and each merged value's
    original values."""

    mapping: tuple[np.ndarray, ...]
    members: tuple[tuple[np.ndarray, ...], ...]

    @property
    def sizes(self) -> list[int]:
        return [len(m) for m in self.members]

    def codes(self, codes: np.ndarray) -> np.ndarray:
        return np.stack([m[codes[:, a]] for a, m in enumerate(self.mapping)], axis=1)


def compress(noisy: Sequence[np.ndarray], sigma: float) -> Compressed:
    mappings, members = [], []
    for counts in noisy:
        supported = np.asarray(counts) >= SUPPORT_STDS * sigma
        if supported.all() or (~supported).sum() == 1:
            mapping = np.arange(len(counts))
        else:
            mapping = np.empty(len(counts), dtype=np.int64)
            mapping[supported] = np.arange(int(supported.sum()))
            mapping[~supported] = int(supported.sum())
        size = int(mapping.max()) + 1
        mappings.append(mapping)
        members.append(tuple(np.flatnonzero(mapping == v) for v in range(size)))
    return Compressed(tuple(mappings), tuple(members))


def one_way_measurements(
    noisy: Sequence[np.ndarray], sizes: Sequence[int], compressed: Compressed, sigma: float
) -> list[LinearMeasurement]:
    full = Domain([_name(a) for a in range(len(sizes))], list(sizes))
    out = []
    for a, counts in enumerate(noisy):
        measurement = LinearMeasurement(np.asarray(counts, dtype=np.float64), (_name(a),), sigma)
        if len(compressed.members[a]) < sizes[a]:
            measurement = measurement.compress({_name(a): compressed.mapping[a]}, full)
        out.append(measurement)
    return out


def two_way_measurement(
    noisy: np.ndarray, pair: tuple[int, int], sigma: float
) -> LinearMeasurement:
    a, b = pair
    return LinearMeasurement(
        np.asarray(noisy, dtype=np.float64).ravel(), (_name(a), _name(b)), sigma
    )


def estimate(
    sizes: Sequence[int],
    measurements: list[LinearMeasurement],
    total: int,
    iterations: int,
    report: Callable[[int], None],
) -> mbi.MarkovRandomField:
    domain = Domain([_name(a) for a in range(len(sizes))], list(sizes))
    done = [0]

    def callback(_: object) -> None:
        done[0] += mbi.estimation.CALLBACK_EVERY
        report(min(done[0], iterations))

    return mbi.estimation.MirrorDescent().estimate(
        domain,
        measurements,
        known_total=float(total),
        iters=iterations,
        callback_fn=callback,
        tol=TOL,
    )


def _distribution(values: np.ndarray) -> np.ndarray:
    """Each row of ``values`` as probabilities: the categorical decoding's own rule
    (negatives set to 0, scaled to sum to 1, uniform where nothing is left)."""
    table = np.atleast_2d(np.asarray(values, dtype=np.float64))
    return category_proportions(table, [tuple(range(table.shape[1]))]).reshape(np.shape(values))


def _draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``p`` (rows of probabilities)."""
    cumulative = np.cumsum(p, axis=-1)
    u = rng.random(len(p))[:, None] * cumulative[:, -1:]
    return np.minimum((u >= cumulative).sum(axis=-1), p.shape[-1] - 1)


def sample(
    model: mbi.MarkovRandomField,
    edges: Sequence[tuple[int, int]],
    attributes: int,
    rows: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``rows`` records (merged values, (rows, k)) drawn by ancestral sampling on the tree."""
    neighbours: dict[int, list[int]] = {a: [] for a in range(attributes)}
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
    codes = np.zeros((rows, attributes), dtype=np.int64)
    seen = [False] * attributes
    for root in range(attributes):
        if seen[root]:
            continue
        marginal = np.asarray(model.project((_name(root),)).datavector())
        codes[:, root] = _draw(np.broadcast_to(_distribution(marginal), (rows, marginal.size)), rng)
        seen[root] = True
        queue = [root]
        while queue:
            parent = queue.pop()
            for child in neighbours[parent]:
                if seen[child]:
                    continue
                joint = model.project((_name(parent), _name(child)))
                table = np.asarray(joint.transpose((_name(parent), _name(child))).datavector(False))
                conditional = _distribution(table)
                codes[:, child] = _draw(conditional[codes[:, parent]], rng)
                seen[child] = True
                queue.append(child)
    return codes


def expand(codes: np.ndarray, compressed: Compressed, rng: np.random.Generator) -> np.ndarray:
    """Merged values back to original values (a merged value: one of its members, uniformly)."""
    out = np.empty_like(codes)
    for a, members in enumerate(compressed.members):
        column = codes[:, a]
        for value, group in enumerate(members):
            where = np.flatnonzero(column == value)
            if where.size:
                out[where, a] = group[rng.integers(len(group), size=where.size)]
    return out
