"""Exact inference on a fitted graphical model, in numpy: the marginals of the junction tree's
maximal cliques (belief propagation on the model's log-potentials), the marginal of any set
of attributes from them, and records drawn from the model.

``mbi`` answers the same questions, but compiles a JAX program for every new clique it is asked
about (about a second each on two cores): AIM scores hundreds of candidate marginals a round,
so they are computed here from the calibrated beliefs instead. Everything reads the model only
(post-processing of the noisy measurements it was fitted to).

Attributes are indices into the domain's sizes; a factor is a pair (attributes, array) whose
axes follow the attributes' order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from dpcore.marginals import _jax  # noqa: F401  (before mbi)

# isort: split
from mbi import Domain, junction_tree

Attrs = tuple[int, ...]
# Rows drawn per block when sampling: bounds the conditional tables' memory.
_BLOCK = 1 << 16


def name(a: int) -> str:
    """The attribute's name in ``mbi``'s domain."""
    return f"a{a}"


def index(attribute: str) -> int:
    return int(attribute[1:])


def domain_of(sizes: Sequence[int]) -> Domain:
    return Domain([name(a) for a in range(len(sizes))], [int(s) for s in sizes])


@dataclass(frozen=True)
class Factor:
    attrs: Attrs
    values: np.ndarray

    def aligned(self, attrs: Attrs) -> np.ndarray:
        """The values broadcastable over ``attrs`` (a superset of this factor's)."""
        order = [a for a in attrs if a in self.attrs]
        values = np.transpose(self.values, [self.attrs.index(a) for a in order])
        shape = [values.shape[order.index(a)] if a in self.attrs else 1 for a in attrs]
        return values.reshape(shape)

    def keep(self, attrs: Sequence[int]) -> Factor:
        """Summed over every attribute not in ``attrs``, axes in this factor's order."""
        kept = tuple(a for a in self.attrs if a in attrs)
        axes = tuple(i for i, a in enumerate(self.attrs) if a not in attrs)
        return Factor(kept, self.values.sum(axis=axes) if axes else self.values)

    def ordered(self, attrs: Attrs) -> np.ndarray:
        """The values with axes in the order of ``attrs`` (the same attributes)."""
        return np.transpose(self.values, [self.attrs.index(a) for a in attrs])


def _product(factors: Sequence[Factor]) -> Factor:
    attrs = tuple(sorted({a for f in factors for a in f.attrs}))
    values = factors[0].aligned(attrs)
    for f in factors[1:]:
        values = values * f.aligned(attrs)
    return Factor(attrs, np.ascontiguousarray(np.broadcast_to(values, _shape(factors, attrs))))


def _shape(factors: Sequence[Factor], attrs: Attrs) -> tuple[int, ...]:
    size: dict[int, int] = {}
    for f in factors:
        size.update(zip(f.attrs, f.values.shape, strict=True))
    return tuple(size[a] for a in attrs)


def _divide(f: Factor, g: Factor) -> Factor:
    """f / g with g's attributes a subset of f's, 0 where g is 0."""
    denominator = g.aligned(f.attrs)
    safe = np.where(denominator > 0, denominator, 1.0)
    return Factor(f.attrs, np.where(denominator > 0, f.values / safe, 0.0))


def _logsumexp(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if not axes:
        return values
    top = np.max(values, axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.squeeze(np.log(np.sum(np.exp(values - top), axis=axes, keepdims=True)) + top, axes)


class JunctionTree:
    """The model's junction tree (``mbi``'s construction over its cliques), calibrated: each
    maximal clique's marginal, scaled to the model's total."""

    def __init__(self, sizes: Sequence[int], potentials: dict[Attrs, np.ndarray], total: float):
        self.sizes = [int(s) for s in sizes]
        self.total = float(total)
        self.tree, self.order = _junction_tree(self.sizes, list(potentials))
        self.cliques: list[Attrs] = list(self.tree.nodes)
        logs: dict[Attrs, np.ndarray] = {
            c: np.zeros([self.sizes[a] for a in c], dtype=np.float64) for c in self.cliques
        }
        for clique, table in potentials.items():
            home = next(c for c in self.cliques if set(clique) <= set(c))
            logs[home] = logs[home] + Factor(clique, np.asarray(table)).aligned(home)
        self.beliefs = self._calibrate(logs, float(total))

    def _calibrate(self, logs: dict[Attrs, np.ndarray], total: float) -> dict[Attrs, Factor]:
        """Sum-product in log space: messages from the leaves to a root and back."""
        root = self.cliques[0]
        edges = list(nx.dfs_edges(self.tree, root))  # parent → child, top-down
        messages: dict[tuple[Attrs, Attrs], np.ndarray] = {}

        def send(source: Attrs, target: Attrs) -> None:
            values = logs[source]
            for other in self.tree.neighbors(source):
                if other != target:
                    values = values + Factor(
                        _separator(other, source), messages[other, source]
                    ).aligned(source)
            keep = _separator(source, target)
            axes = tuple(i for i, a in enumerate(source) if a not in keep)
            messages[source, target] = _logsumexp(values, axes)

        for parent, child in reversed(edges):
            send(child, parent)
        for parent, child in edges:
            send(parent, child)
        beliefs = {}
        for clique in self.cliques:
            values = logs[clique]
            for other in self.tree.neighbors(clique):
                values = values + Factor(
                    _separator(other, clique), messages[other, clique]
                ).aligned(clique)
            values = np.exp(values - np.max(values))
            beliefs[clique] = Factor(clique, total * values / values.sum())
        return beliefs

    def marginal(self, attrs: Sequence[int]) -> np.ndarray:
        """The model's marginal over ``attrs`` (axes in that order), scaled to its total."""
        wanted = tuple(attrs)
        home = next((c for c in self.cliques if set(wanted) <= set(c)), None)
        if home is not None:
            return self.beliefs[home].keep(wanted).ordered(wanted)
        # The smallest subtree holding every attribute: the joint over it is the product of
        # its cliques' beliefs over the product of its separators' (a junction tree's
        # factorisation), summed out from the leaves up.
        holders = [next(c for c in self.cliques if a in c) for a in wanted]
        root = holders[0]
        nodes = set().union(*(nx.shortest_path(self.tree, root, h) for h in holders[1:]))
        subtree = self.tree.subgraph(nodes)

        def up(clique: Attrs, parent: Attrs | None) -> Factor:
            factors = [self.beliefs[clique]]
            for child in subtree.neighbors(clique):
                if child != parent:
                    separator = self.beliefs[clique].keep(_separator(child, clique))
                    factors.append(_divide(up(child, clique), separator))
            joint = _product(factors)
            keep = set(wanted) | (set(_separator(clique, parent)) if parent else set())
            return joint.keep(sorted(keep))

        result = up(root, None)
        values = result.ordered(tuple(sorted(wanted)))
        values = values * (self.total / max(values.sum(), np.finfo(float).tiny))
        return np.transpose(values, [sorted(wanted).index(a) for a in wanted])

    def sample(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """``rows`` records (rows, k) drawn from the model: attributes in the reverse of the
        junction tree's elimination order, each from its conditional given those already
        drawn that share a clique with it (one maximal clique holds them all)."""
        k = len(self.sizes)
        codes = np.zeros((rows, k), dtype=np.int64)
        drawn: list[int] = []
        for a in reversed(self.order):
            near = set().union(*(set(c) for c in self.cliques if a in c))
            parents = tuple(p for p in drawn if p in near)
            table = self.marginal((*parents, a))
            parent_codes = tuple(codes[:, p] for p in parents)
            for start in range(0, rows, _BLOCK):
                stop = min(rows, start + _BLOCK)
                p = table[tuple(c[start:stop] for c in parent_codes)] if parents else table
                p = np.broadcast_to(p, (stop - start, self.sizes[a]))
                codes[start:stop, a] = _draw(p, rng)
            drawn.append(a)
        return codes


def _junction_tree(sizes: list[int], cliques: list[Attrs]) -> tuple[nx.Graph, list[int]]:
    """``mbi``'s junction tree of ``cliques`` over attribute indices, and its elimination
    order."""
    named = [tuple(name(a) for a in c) for c in cliques]
    # Every attribute takes part, even one no measurement covers.
    named += [(name(a),) for a in range(len(sizes))]
    tree, order = junction_tree.make_junction_tree(domain_of(sizes), named)
    tree = nx.relabel_nodes(tree, {c: tuple(index(a) for a in c) for c in tree.nodes})
    # Independent parts of the model form a forest: joined by empty separators (scalar
    # messages), it is one tree whose factorisation still holds.
    components = [min(c) for c in nx.connected_components(tree)]
    tree.add_edges_from((components[0], other) for other in components[1:])
    return tree, [index(a) for a in order]


_MIB = 8 / 2**20  # a float64 cell, in MiB


class Growth:
    """How large a model over ``cliques`` is (MiB of float64 tables over its junction tree's
    cliques, ``mbi``'s measure) and a bound on how large it gets with one clique more: the
    current tree with the new clique's missing attributes added to every clique on the path
    between cliques holding them is a junction tree of the grown model (a chordal supergraph),
    so its size bounds the smallest one. Cheap (no triangulation per candidate); a function of
    ``cliques`` only."""

    def __init__(self, sizes: Sequence[int], cliques: Sequence[Attrs]):
        self.sizes = [int(s) for s in sizes]
        self.tree, _ = _junction_tree(self.sizes, list(cliques))
        self.cells = {c: float(np.prod([self.sizes[a] for a in c])) for c in self.tree.nodes}
        self.size = sum(self.cells.values()) * _MIB
        self.holders = {a: [c for c in self.tree.nodes if a in c] for a in range(len(self.sizes))}

    def inside(self, clique: Attrs) -> bool:
        return any(set(clique) <= set(c) for c in self.holders[clique[0]])

    def bound(self, clique: Attrs) -> float:
        """An upper bound on the model's size with ``clique`` (one or two attributes) added."""
        if self.inside(clique):
            return self.size
        a, b = clique
        path = nx.shortest_path(self.tree, self.holders[a][0], self.holders[b][0])
        grow_a = sum(self.cells[c] * (self.sizes[a] - 1) for c in path if a not in c)
        grow_b = sum(self.cells[c] * (self.sizes[b] - 1) for c in path if b not in c)
        return self.size + min(grow_a, grow_b) * _MIB


def _separator(a: Attrs, b: Attrs | None) -> Attrs:
    return tuple(x for x in a if b is not None and x in b)


def _draw(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of non-negative ``weights`` (uniform where a row is all zero)."""
    w = np.clip(weights, 0.0, None)
    totals = w.sum(axis=1, keepdims=True)
    w = np.where(totals > 0, w, 1.0)
    cumulative = np.cumsum(w, axis=1)
    u = rng.random(len(w))[:, None] * cumulative[:, -1:]
    return np.minimum((u >= cumulative).sum(axis=1), w.shape[1] - 1)


def junction_tree_of(model: Any, sizes: Sequence[int]) -> JunctionTree:
    """The calibrated junction tree of an ``mbi`` model (its log-potentials and total)."""
    potentials = {
        tuple(index(a) for a in clique): np.asarray(
            model.potentials[clique].transpose(clique).values, dtype=np.float64
        )
        for clique in model.potentials.cliques
    }
    return JunctionTree(sizes, potentials, float(model.total))
