"""Released rows in the data's domain: every value within its declared bounds, every declared
categorical column one category per row.

A mechanism that releases rows in the dataset's own units (records, their means, their noisy
mixtures) may draw values outside the declared bounds and categorical blocks that are noisy
mixtures of one-hot vectors. Mapping each row into the domain reads nothing but the drawn row
and fresh randomness independent of the data, so it is post-processing: it costs no privacy
(docs/privacy.md, "Rows in the data's domain"). The rows as drawn stay the owner's copy.

Per row: each categorical block is read as the row's category proportions
(``categorical.category_proportions``: negative parts set to 0, scaled to sum to 1, uniform
where nothing is positive) and replaced by the one-hot vector of one category drawn from them;
then each value is clipped to its column's declared [lo, hi]; each column declared integer is
rounded at random to a neighbouring whole number (up with the fractional part as probability,
so its mean stays where it was) within its bounds; then each missing-value
indicator becomes 0 or 1 (1 with its value as probability), and where it is 1 the column
holds what the upload writes for a missing entry (its declared fill).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcore.categorical import category_proportions, encoded_names, fill_missing

DESCRIPTION = (
    "rows in the declared domain (post-processing of the rows as drawn): each value clipped "
    "to its column's declared bounds, each declared categorical column one category per row, "
    "drawn from the row's category proportions (the block's negative parts set to 0, scaled "
    "to sum to 1), each missing-value indicator 0 or 1 (1 with its clipped value as "
    "probability; the column then holds its declared fill, as an upload encodes a missing "
    "entry); the owner's raw copy keeps the rows as drawn"
)


@dataclass(frozen=True)
class MissingIndicator:
    """A declared column's missing-value indicator feature and what the upload encodes a
    missing entry as: the column's features and their declared fill (public)."""

    indicator: int
    features: tuple[int, ...]
    fill: tuple[float, ...]


def missing_indicators(declared: Sequence[Mapping[str, Any]]) -> tuple[MissingIndicator, ...]:
    """The indicator features of a declaration (``declared_columns``: dicts as the release
    metadata holds them), at their places in ``categorical.encoded_names`` (each right after
    its column's features), each with the encoding of a missing entry
    (``categorical.fill_missing`` on one row)."""
    names = encoded_names(declared)
    out = []
    for column in declared:
        missing = column.get("missing") or {}
        if missing.get("policy") != "indicator":
            continue
        categories = column.get("categories") if column["type"] != "numeric" else None
        width = 1 if categories is None else len(categories)
        block = np.zeros((1, width))
        fill_missing(
            block,
            np.array([True]),
            column["name"],
            missing,
            bounds=column.get("bounds"),
            categories=categories,
        )
        indicator = names.index(f"{column['name']}_missing")
        features = tuple(range(indicator - width, indicator))
        out.append(MissingIndicator(indicator, features, tuple(float(v) for v in block[0])))
    return tuple(out)


def integer_features(
    declared: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
) -> tuple[int, ...]:
    """The features of the columns a declaration marks integer, at their places among the
    dataset's feature ``names`` (an NPZ's are its columns' indices, in the file's order, which
    a declaration may list in any order), or in ``categorical.encoded_names`` without them."""
    names = list(names) if names is not None else encoded_names(declared)
    return tuple(
        names.index(column["name"])
        for column in declared
        if column["type"] == "numeric" and column.get("integer")
    )


def round_integers(
    X: np.ndarray,
    features: Sequence[int],
    lo: np.ndarray,
    hi: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """Round ``X``'s ``features`` in place to whole numbers within [⌈lo⌉, ⌊hi⌋]: up with the
    value's fractional part as probability (unbiased), from ``rng`` (post-processing)."""
    for j in features:
        values = X[:, j].astype(np.float64)
        base = np.floor(values)
        whole = base + (rng.random(len(values)) < values - base)
        X[:, j] = np.clip(whole, math.ceil(lo[j]), math.floor(hi[j]))


def in_data_units(
    feature_names: Sequence[str], dataset_names: Sequence[str], transform: Any
) -> bool:
    """Whether released rows are the dataset's own features in raw units — the rows the
    declared domain applies to (not projections, not SGDRM's signed combinations, not a
    transform's other output). ``transform``: the release's ``RowTransform`` or None."""
    same_names = list(feature_names) == list(dataset_names)
    return same_names and (transform is None or transform.output == "raw")


def sample_categories(
    X: np.ndarray, blocks: Sequence[Sequence[int]], rng: np.random.Generator
) -> np.ndarray:
    """``X`` (a copy) with each block replaced by the one-hot vector of one category per row,
    drawn with the probabilities ``category_proportions`` reads off the block."""
    out = category_proportions(X, blocks)
    for block in blocks:
        idx = list(block)
        cumulative = np.cumsum(out[:, idx], axis=1, dtype=np.float64)
        # One uniform per row against the cumulative proportions: category j with probability
        # p_j (the last cumulative is 1 up to rounding; the clamp keeps a u above it in range).
        u = rng.random(len(out))[:, None] * cumulative[:, -1:]
        chosen = np.minimum((u >= cumulative).sum(axis=1), len(idx) - 1)
        out[:, idx] = 0
        out[np.arange(len(out)), np.asarray(idx)[chosen]] = 1
    return out


def into_domain(
    X: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    blocks: Sequence[Sequence[int]],
    rng: np.random.Generator,
    indicators: Sequence[MissingIndicator] = (),
    integers: Sequence[int] = (),
) -> np.ndarray:
    """Rows ``X`` (raw units, one column per feature) mapped into the declared domain:
    categorical blocks sampled from the drawn proportions, then values clipped to [lo, hi]
    column by column (a one-hot block is within its [0, 1] bounds), the ``integers`` features
    rounded (``round_integers``), then each missing-value
    indicator drawn as 0 or 1 with its clipped value as the probability of 1, the column's
    features set to their declared fill where it is 1 (as the upload encodes a missing
    entry). Same dtype."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if X.shape[1] != lo.shape[0] or lo.shape != hi.shape:
        raise ValueError(f"rows of width {X.shape[1]} against {lo.shape[0]} declared bounds")
    out = sample_categories(X, blocks, rng) if blocks else X
    out = np.clip(out, lo.astype(X.dtype), hi.astype(X.dtype))
    round_integers(out, integers, lo, hi, rng)
    for rule in indicators:
        gaps = rng.random(len(out)) < np.clip(out[:, rule.indicator], 0.0, 1.0)
        out[:, rule.indicator] = gaps
        out[np.ix_(gaps, list(rule.features))] = np.asarray(rule.fill, dtype=out.dtype)
    return out
