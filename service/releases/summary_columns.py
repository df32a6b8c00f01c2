"""The per-column histograms of a release summary (``service.releases.summary``), accumulated
chunk by chunk of rows, so a summary holds one chunk of the file in memory, not the file.

A numeric column is binned over its declared bounds (public) or, without them, over its own
min–max in the release, which a first pass over the chunks finds (``scan``); the bins' counts
then add up over the chunks exactly as over the whole column (the same edges for every
chunk). Like the summary, this is post-processing of the released rows only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Literal

import numpy as np

from dpcore import release_layout
from dpcore.table import decode
from service.releases.schemas import SummaryHistogram, SummaryValueRange

BINS = 20
# Significant digits of the values shown: enough for a picture or a glance, and a 28 × 28
# image sample stays a few hundred kilobytes of JSON.
DIGITS = 6


def rounded(value: float) -> float:
    return float(f"{value:.{DIGITS}g}") if math.isfinite(value) else value


@dataclass
class Chunk:
    """Consecutive rows of the release: encoded features X and the label matrix Y (float64),
    and, for a declared table, its columns decoded once for every histogram."""

    X: np.ndarray
    Y: np.ndarray
    layout: release_layout.Layout | None

    @cached_property
    def decoded(self) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self.layout is not None
        return decode(self.X, self.layout.table)


# A column's values in a chunk and its missing mask (None: nothing is missing).
Pick = Callable[[Chunk], tuple[np.ndarray, np.ndarray | None]]


class Column:
    """One histogram, accumulated over the chunks."""

    needs_range = False

    def scan(self, chunk: Chunk) -> None:
        """First pass, for a column binned over its own range."""

    def add(self, chunk: Chunk) -> None:
        raise NotImplementedError

    def result(self) -> SummaryHistogram:
        raise NotImplementedError


@dataclass
class Binned(Column):
    """``BINS`` equal bins over [lo, hi] (the declared range), else over the column's own
    min–max; values outside the declared range are counted as below or above it; non-finite
    values are left out."""

    column: str
    pick: Pick
    lo: float | None
    hi: float | None
    seen: list[float] = field(default_factory=list)  # [min, max] of the finite values
    counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS, dtype=np.int64))
    below: int = 0
    above: int = 0
    missing: int = 0

    def __post_init__(self) -> None:
        self.source: Literal["declared", "release"] = (
            "declared" if self.lo is not None and self.hi is not None else "release"
        )
        self.needs_range = self.source == "release"

    def _finite(self, chunk: Chunk) -> tuple[np.ndarray, int]:
        values, missing = self.pick(chunk)
        if missing is not None:
            values = values[~missing].astype(np.float64)
        return values[np.isfinite(values)], 0 if missing is None else int(missing.sum())

    def scan(self, chunk: Chunk) -> None:
        values, _ = self._finite(chunk)
        if values.size:
            low, high = float(values.min()), float(values.max())
            self.seen = (
                [min(self.seen[0], low), max(self.seen[1], high)]
                if self.seen
                else [
                    low,
                    high,
                ]
            )

    def _range(self) -> tuple[float, float]:
        lo, hi = self.lo, self.hi
        if lo is None or hi is None:
            lo, hi = self.seen if self.seen else (0.0, 1.0)
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5  # a constant column: one bin holds it
        return lo, hi

    def add(self, chunk: Chunk) -> None:
        values, missing = self._finite(chunk)
        lo, hi = self._range()
        self.counts += np.histogram(values, bins=BINS, range=(lo, hi))[0]
        self.below += int((values < lo).sum())
        self.above += int((values > hi).sum())
        self.missing += missing

    def result(self) -> SummaryHistogram:
        edges = np.histogram_bin_edges(np.zeros(0), bins=BINS, range=self._range())
        return SummaryHistogram(
            column=self.column,
            kind="numeric",
            range_source=self.source,
            edges=[rounded(float(e)) for e in edges],
            counts=[int(c) for c in self.counts],
            below=self.below,
            above=self.above,
            missing=self.missing,
        )


@dataclass
class Counted(Column):
    """Rows per category: a declared categorical column's (its missing entries apart), or an
    exact label's classes (its one-hot label matrix summed)."""

    column: str
    categories: Sequence[Any]
    index: int | None  # the declared table column; None: the exact label
    counts: np.ndarray | None = None
    missing: int = 0

    def add(self, chunk: Chunk) -> None:
        if self.index is None:
            counts = chunk.Y.sum(axis=0)
        else:
            values, missing = chunk.decoded[self.index]
            held = values[~missing]
            wanted = np.asarray(self.categories, dtype=held.dtype)
            counts = np.array([np.sum(held == c) for c in wanted], dtype=np.float64)
            self.missing += int(missing.sum())
        self.counts = counts if self.counts is None else self.counts + counts

    def result(self) -> SummaryHistogram:
        counts = np.zeros(len(self.categories)) if self.counts is None else self.counts
        return SummaryHistogram(
            column=self.column,
            kind="categorical",
            categories=[str(c) for c in self.categories],
            counts=[int(c) for c in counts.round()],
            missing=self.missing,
        )


def _feature(j: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray | None]:
    return chunk.X[:, j], None


def _label(j: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray | None]:
    return chunk.Y[:, j], None


def _table_column(i: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray | None]:
    return chunk.decoded[i]


def _declared(declared: SummaryValueRange | None, j: int) -> tuple[float | None, float | None]:
    return (declared.lo[j], declared.hi[j]) if declared is not None else (None, None)


def feature_columns(names: Sequence[str], declared: SummaryValueRange | None) -> list[Column]:
    return [
        Binned(name, partial(_feature, j), *_declared(declared, j)) for j, name in enumerate(names)
    ]


def table_columns(
    layout: release_layout.Layout, declared: SummaryValueRange | None
) -> list[Column]:
    """A declared table's columns as the file holds them (``dpcore.table``): a categorical
    column's rows per category, a numeric one's bins over its declared bounds; each with its
    missing entries counted apart."""
    out: list[Column] = []
    for i, column in enumerate(layout.table):
        if column.type == "categorical":
            out.append(Counted(column.name, column.categories, i))
        else:
            lo, hi = _declared(declared, column.features[0])
            out.append(Binned(column.name, partial(_table_column, i), lo, hi))
    return out


def label_columns(names: Sequence[str], layout: release_layout.Layout | None) -> list[Column]:
    """An exact label: the rows per class. Proportions: each class column over [0, 1]. Other
    label columns (signed combinations): over their own min–max."""
    if layout is not None and layout.kind == "exact":
        return [Counted(layout.label, layout.classes, None)]
    unit = layout is not None and layout.kind == "proportions" and not layout.as_drawn
    return [
        Binned(name, partial(_label, j), 0.0 if unit else None, 1.0 if unit else None)
        for j, name in enumerate(names)
    ]
