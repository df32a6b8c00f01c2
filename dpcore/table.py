"""A release of a declared table as that table: the uploaded columns, in their order, with
their names and types.

An upload's declared columns (``columns``: numeric, integer or categorical, each with an
optional missing-value policy) are encoded into features: a numeric column is one feature, a
categorical column a one-hot block ``<name>=<category>``, an indicator policy one more feature
``<name>_missing`` (``dpcore.categorical``). Rows in the declared domain (``dpcore.domain``:
one category per block, indicators 0 or 1, integer columns whole) decode back to the table
exactly, one column per declared column:

- numeric: the value; integer: the value as a whole number;
- categorical: the category whose one-hot feature is 1 (a block with no 1 — what a missing
  entry without a fill encodes to — is a missing value);
- a column with an indicator: missing where the indicator is 1, whatever its features hold.

Decoding reads the released rows and the public declaration only: post-processing, free of
privacy cost. A table written this way re-encodes (``categorical.encode_declared``) to the
features it was decoded from, except that a missing entry takes its declared fill, as the
upload encodes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ColumnType = Literal["numeric", "integer", "categorical"]

DESCRIPTION = (
    "one column per declared column, in the declared order, under its name: numeric columns "
    "as numbers, integer columns as whole numbers, categorical columns as the category "
    "itself (integers where every declared category is an integer, else text); missing where "
    "the column's missing-value indicator is 1 (and where a categorical column holds no "
    "category); decoded from the encoded features, which an NPZ's X holds "
    "(feature_columns), post-processing of the release"
)


@dataclass(frozen=True)
class TableColumn:
    """One declared column: its type, its features' positions in the encoded rows and its
    indicator's (None without an indicator policy); the categories of a categorical one."""

    name: str
    type: ColumnType
    features: tuple[int, ...]
    indicator: int | None = None
    categories: tuple[Any, ...] = ()

    @property
    def integer_categories(self) -> bool:
        return all(isinstance(c, int) and not isinstance(c, bool) for c in self.categories)

    @property
    def value_type(self) -> Literal["float", "int", "text"]:
        """How a table holds the column's values."""
        if self.type == "numeric":
            return "float"
        if self.type == "integer" or self.integer_categories:
            return "int"
        return "text"

    def describe(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "values": self.value_type,
            "may_be_missing": self.indicator is not None or self.type == "categorical",
        }
        if self.type == "categorical":
            entry["categories"] = list(self.categories)
        return entry


def table_columns(declared: Sequence[Mapping[str, Any]]) -> tuple[TableColumn, ...]:
    """The table of a declaration (dicts as the release metadata's ``declared_columns``
    holds them), with each column's features at their places in ``encoded_names``."""
    out = []
    j = 0
    for column in declared:
        categorical = column["type"] != "numeric"
        width = len(column["categories"]) if categorical else 1
        features = tuple(range(j, j + width))
        j += width
        indicator = None
        if (column.get("missing") or {}).get("policy") == "indicator":
            indicator = j
            j += 1
        if categorical:
            kind: ColumnType = "categorical"
        else:
            kind = "integer" if column.get("integer") else "numeric"
        categories = tuple(column["categories"]) if categorical else ()
        out.append(TableColumn(column["name"], kind, features, indicator, categories))
    return tuple(out)


def decode(X: np.ndarray, columns: Sequence[TableColumn]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Encoded rows ``X`` (in the declared domain) as the table's columns: per column, its
    values (float64, int64 or an object array of categories) and its missing mask. Rows not
    in the domain decode too: a block's largest feature is its category (none when nothing
    is positive), an indicator of at least one half marks a missing entry, an integer
    column is rounded to the nearest whole number."""
    X = np.asarray(X)
    out = []
    for column in columns:
        missing = np.zeros(len(X), dtype=bool)
        if column.indicator is not None:
            missing |= X[:, column.indicator] >= 0.5
        if column.type == "categorical":
            block = X[:, list(column.features)]
            missing |= ~(block > 0).any(axis=1)
            index = block.argmax(axis=1)
            if column.integer_categories:
                values: np.ndarray = np.asarray(column.categories, dtype=np.int64)[index]
            else:
                names = np.asarray([str(c) for c in column.categories], dtype=object)
                values = names[index]
        elif column.type == "integer":
            values = np.rint(X[:, column.features[0]]).astype(np.int64)
        else:
            values = X[:, column.features[0]].astype(np.float64)
        out.append((values, missing))
    return out
