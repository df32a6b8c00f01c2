"""The noisy marginals into a graphical model (Private-PGM, the ``mbi`` library's mirror
descent), and records drawn from it. Reads released values and public facts only.

- ``compress``: MST's domain compression. An attribute's values whose noisy one-way count is
  below 3σ₁ merge into one value (when more than one is), and its one-way measurement is
  re-expressed on the merged domain (``mbi.LinearMeasurement.compress``).
- ``estimate``: the model whose marginals best fit every noisy measurement (known total n).
- ``sample``: records drawn exactly from the model on its junction tree (``inference``: numpy
  on the caller's generator, where ``mbi``'s sampler uses numpy's global random state); with
  ``expand``, a merged value becomes one of its original values, uniformly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpcore.marginals import _jax  # noqa: F401  (before mbi)

# isort: split
import jax
import mbi
from mbi import LinearMeasurement

from dpcore.marginals import inference
from dpcore.marginals.inference import domain_of, name

SUPPORT_STDS = 3.0
TOL = 1e-5


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
    full = domain_of(sizes)
    out = []
    for a, counts in enumerate(noisy):
        measurement = LinearMeasurement(np.asarray(counts, dtype=np.float64), (name(a),), sigma)
        if len(compressed.members[a]) < sizes[a]:
            measurement = measurement.compress({name(a): compressed.mapping[a]}, full)
        out.append(measurement)
    return out


def measurement(noisy: np.ndarray, clique: Sequence[int], sigma: float) -> LinearMeasurement:
    """A noisy marginal over ``clique`` (axes in the clique's order) with noise std σ."""
    return LinearMeasurement(
        np.asarray(noisy, dtype=np.float64).ravel(), tuple(name(a) for a in clique), sigma
    )


def estimate(
    sizes: Sequence[int],
    measurements: list[LinearMeasurement],
    total: int,
    iterations: int,
    report: Callable[[int], None],
    warm_start: mbi.MarkovRandomField | None = None,
) -> mbi.MarkovRandomField:
    """The model fitted to ``measurements`` (``warm_start``: a model to start from, e.g. the
    previous round's, whose cliques the new measurements extend)."""
    domain = domain_of(sizes)
    done = [0]

    def callback(_: object) -> None:
        done[0] += mbi.estimation.CALLBACK_EVERY
        report(min(done[0], iterations))

    fitted = mbi.estimation.MirrorDescent().estimate(
        domain,
        measurements,
        known_total=float(total),
        iters=iterations,
        callback_fn=callback,
        tol=TOL,
        warm_start=warm_start,
    )
    # Every fit compiles programs for its own set of measurements, never run again (AIM adds
    # one each round): JAX keeps compiled programs for the process's life unless cleared, and
    # a worker running many releases would run out of memory for them.
    jax.clear_caches()
    return fitted


def junction_tree(model: mbi.MarkovRandomField, sizes: Sequence[int]) -> inference.JunctionTree:
    """The model's calibrated junction tree: any marginal of it, in numpy."""
    return inference.junction_tree_of(model, sizes)


def sample(
    model: mbi.MarkovRandomField, sizes: Sequence[int], rows: int, rng: np.random.Generator
) -> np.ndarray:
    """``rows`` records ((rows, k) values of the model's domain) drawn exactly from the model
    (``inference.JunctionTree.sample``, on the caller's generator)."""
    return inference.junction_tree_of(model, sizes).sample(rows, rng)


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
