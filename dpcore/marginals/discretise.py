"""A table's records as MST's discrete attributes, and back, by public rules only.

Every rule reads the declaration (bounds, categorical blocks, missing-value indicators) and
the request's ``bins``, never the data:
- a numeric feature is its declared [lo, hi] cut into ``bins`` equal-width bins (the records
  arrive scaled to [0, 1] by those bounds);
- a missing-value indicator feature is one binary attribute;
- a categorical column's one-hot block is one attribute with a value per category, plus one
  for "no category" where the declaration lets a missing entry leave the block empty;
- the label is one attribute with a value per declared class.

Back: a bin becomes a value drawn uniformly within it; the other attributes are their 0/1
features. Both directions are post-processing of what they read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpcore.domain import MissingIndicator
from dpcore.mechanisms.contract import PrivateData
from dpcore.preprocessing import RowTransform

Kind = Literal["numeric", "binary", "categorical", "label"]

# Numeric columns' bins where the request names none: about 30 rows per bin or more, a power of
# two within [4, 16] (n public). Measured on the study's tables with MST: docs/results/mst.md,
# "Bins".
BINS_RULE = "n/30 rounded down to a power of two, within [4, 16] (measured: docs/results/mst.md)"


def widest_attribute(bins: int, n_features: int, n_classes: int) -> int:
    """An upper bound on any attribute's number of values, from public figures: numeric bins,
    a categorical block (at most every feature), the label, each with a value for "none"."""
    return max(bins, n_features, n_classes) + 1


def default_bins(n: int) -> int:
    bins = 1 << max(0, (max(1, n) // 30).bit_length() - 1)
    return min(16, max(4, bins))


@dataclass(frozen=True)
class Attribute:
    """One discrete attribute: its name (the feature's or column's), its number of values,
    what it encodes and the features it covers (none for the label). A categorical attribute
    with ``empty`` has a last value for an all-zero block."""

    name: str
    size: int
    kind: Kind
    features: tuple[int, ...] = ()
    empty: bool = False


def layout(
    feature_names: Sequence[str],
    blocks: Sequence[Sequence[int]],
    indicators: Sequence[MissingIndicator],
    n_classes: int,
    bins: int,
) -> list[Attribute]:
    """The attributes of a table, in feature order (a block where its first feature is), then
    the label. Their count is ``categorical.columns_of`` plus one."""
    block_of = {block[0]: tuple(block) for block in blocks}
    inside = {j for block in blocks for j in block}
    binary = {ind.indicator for ind in indicators}
    # A missing entry of a categorical column whose declared fill names no category leaves
    # the block all zeros (``categorical.fill_missing``).
    # (A block of one category counts too: a numeric column's indicator covers no block.)
    empty_blocks = {
        tuple(ind.features)
        for ind in indicators
        if tuple(ind.features) in block_of.values() and not any(ind.fill)
    }
    out: list[Attribute] = []
    for j, name in enumerate(feature_names):
        if j in block_of:
            block = block_of[j]
            empty = block in empty_blocks
            column = name.split("=", 1)[0]
            out.append(Attribute(column, len(block) + empty, "categorical", block, empty))
        elif j in inside:
            continue
        elif j in binary:
            out.append(Attribute(name, 2, "binary", (j,)))
        else:
            out.append(Attribute(name, bins, "numeric", (j,)))
    out.append(Attribute("label", max(1, n_classes), "label"))
    return out


def encode(unit: np.ndarray, labels: np.ndarray, attributes: Sequence[Attribute]) -> np.ndarray:
    """Records (features scaled to [0, 1] by the declared bounds; class indices) as an
    (n, k) integer array of attribute values."""
    n = len(unit)
    codes = np.empty((n, len(attributes)), dtype=np.int64)
    for a, attribute in enumerate(attributes):
        if attribute.kind == "label":
            codes[:, a] = labels
        elif attribute.kind == "numeric":
            z = unit[:, attribute.features[0]]
            codes[:, a] = np.clip(np.floor(z * attribute.size), 0, attribute.size - 1)
        elif attribute.kind == "binary":
            codes[:, a] = unit[:, attribute.features[0]] >= 0.5
        else:
            block = unit[:, list(attribute.features)]
            chosen = np.argmax(block, axis=1)
            if attribute.empty:
                chosen = np.where(block.max(axis=1) >= 0.5, chosen, attribute.size - 1)
            codes[:, a] = chosen
    return codes


def decode(
    codes: np.ndarray,
    attributes: Sequence[Attribute],
    n_features: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Attribute values back to features in [0, 1] (a numeric bin as a uniform draw within
    it) and class indices."""
    n = len(codes)
    unit = np.zeros((n, n_features), dtype=np.float64)
    labels = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    for a, attribute in enumerate(attributes):
        values = codes[:, a]
        if attribute.kind == "label":
            labels = values.astype(np.int64)
        elif attribute.kind == "numeric":
            unit[:, attribute.features[0]] = (values + rng.random(n)) / attribute.size
        elif attribute.kind == "binary":
            unit[:, attribute.features[0]] = values
        else:
            features = np.asarray(attribute.features)
            filled = values < len(features)
            unit[rows[filled], features[values[filled]]] = 1.0
    return unit, labels


@dataclass(frozen=True)
class Discretised:
    """A dataset's records as attribute values, with the attributes and the [0, 1] scaling
    by the declared bounds the values were read under."""

    attributes: list[Attribute]
    codes: np.ndarray
    transform: RowTransform

    @property
    def sizes(self) -> list[int]:
        return [a.size for a in self.attributes]


def discretise(data: PrivateData, bins: int, charged_attributes: int) -> Discretised:
    """``data``'s records as attribute values, refused (before any noise is drawn) unless
    the release was charged for as many attributes as the data has."""
    attributes = layout(
        data.feature_names,
        getattr(data, "categorical_blocks", ()),
        getattr(data, "missing_indicators", ()),
        len(data.classes),
        bins,
    )
    if len(attributes) != charged_attributes:
        raise ValueError(
            f"the release was charged for {charged_attributes} attributes; the data has "
            f"{len(attributes)}"
        )
    transform = RowTransform.unit_range(data.lo, data.hi, None)
    return Discretised(
        attributes, encode(transform.rows(data.X), data.labels, attributes), transform
    )
