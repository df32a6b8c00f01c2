"""The columns of a release table: the dataset's own names.

A CSV or Parquet release of a dataset uploaded with declared ``columns``, whose rows are its
own features in its declared domain, holds those columns as uploaded (``dpcore.table``: names,
order, types, categories, missing values). Any other CSV or Parquet release has one column per
feature, named exactly as the dataset's feature (declared categorical columns one-hot features
``<column>=<category>``, as the owner's raw copy keeps them). Then comes the label, under the
dataset's label column name, in the form the mechanism's label kind
(``MechanismSpec.label_kind``) allows:

- ``exact``: every released row has one true class (a mixture of one class's records, a
  cluster's mean, a class-conditional generator's sample): ONE column named as the label
  column, holding the class (declared class names: integers when every class is an integer,
  else text).
- ``proportions``: noisy class vectors (mixed or perturbed one-hot labels): one column
  ``<label>=<class>`` per class holding the row's class proportions: negative parts set to 0,
  scaled to sum to 1, uniform where nothing positive is left. Post-processing of the released
  values (``dpcore.categorical.category_proportions``): it costs no privacy.
- ``combinations``: signed random combinations of one-hot labels (SGDRM): one column
  ``<label>=<class>`` per class holding the raw signed values (a learner needs them as drawn).

An NPZ release keeps arrays ``X`` (rows × features) and ``y`` (rows × classes: one-hot for
exact labels, the proportions or values otherwise), so NPZ readers keep working. The layout
travels in every format's metadata under ``layout`` (``Layout.describe``); readers
(``dpcore.evaluation``) turn it back into X and a label matrix Y.

Everything here reads public names (the declared feature names, label column and classes) and
the released values only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcore import table as table_schema
from dpcore.categorical import (
    DeclaredValueError,
    category_proportions,
    encode_declared,
    encoded_names,
)
from dpcore.mechanisms.spec import LABEL_KINDS, LabelKind
from dpcore.table import TableColumn

#: The label column's name when the dataset names none (NPZ uploads have no label column).
DEFAULT_LABEL = "label"

_MEANING: dict[str, str] = {
    "exact": "one column named as the dataset's label column, holding each row's class (one "
    "of `classes`); each released row has exactly one true class",
    "proportions": "one column '<label>=<class>' per class, holding the row's class "
    "proportions: the noisy label vector with negative parts set to 0, scaled to sum to 1 "
    "(uniform where nothing positive is left); post-processing of the release",
    "combinations": "one column '<label>=<class>' per class, holding the raw signed values: "
    "the same random combinations of one-hot labels as the features, noisy; learn from them "
    "as drawn (e.g. dpcore.learning.bias_corrected_sgd)",
}
_AS_DRAWN = (
    "one column '<label>=<class>' per class, holding the label vector as drawn (the owner's "
    "raw copy: no post-processing)"
)
_NPZ = (
    "arrays X (rows × feature_columns, in that order) and y (rows × classes, in `classes` "
    "order: one-hot for exact labels, else the values the label columns hold)"
)


class LayoutError(ValueError):
    """A release's column names collide, or a release file does not match its layout."""


@dataclass(frozen=True)
class Layout:
    """The columns of one release file. ``as_drawn``: the owner's raw copy, whose label
    vectors are left as drawn (the release's own post-processing is what it lacks).
    ``table``: the declared columns a CSV or Parquet file holds in place of the encoded
    features (``dpcore.table``; empty: the features themselves)."""

    features: tuple[str, ...]
    label: str
    kind: LabelKind
    classes: tuple[Any, ...]
    as_drawn: bool = False
    table: tuple[TableColumn, ...] = ()

    @classmethod
    def of(
        cls,
        features: Sequence[str],
        label: str | None,
        kind: LabelKind,
        classes: Sequence[Any],
        *,
        as_drawn: bool = False,
        declared: Sequence[Mapping[str, Any]] | None = None,
    ) -> Layout:
        """``declared``: the dataset's declared columns, given where the release's rows are
        the dataset's own features in its declared domain; the table then holds those
        columns (``dpcore.table``)."""
        if kind not in LABEL_KINDS:
            raise LayoutError(f"unknown label kind {kind!r}; known: {LABEL_KINDS}")
        table: tuple[TableColumn, ...] = ()
        if declared is not None:
            if encoded_names(declared) != list(features):
                raise LayoutError("the declared columns do not encode to the release's features")
            table = table_schema.table_columns(declared)
        layout = cls(tuple(features), label or DEFAULT_LABEL, kind, tuple(classes), as_drawn, table)
        names = [*layout.features, *layout.table_names]
        clash = collisions(names, layout.label, layout.classes, kinds=(kind,))
        if clash:
            raise LayoutError(
                f"the release's label column(s) {clash} would repeat a feature's name; "
                "rename the label column or the feature"
            )
        return layout

    @property
    def label_columns(self) -> list[str]:
        if self.kind == "exact":
            return [self.label]
        return class_columns(self.label, self.classes)

    @property
    def table_names(self) -> list[str]:
        return [c.name for c in self.table]

    @property
    def columns(self) -> list[str]:
        """A CSV or Parquet file's columns, in order."""
        return [*(self.table_names or self.features), *self.label_columns]

    @property
    def integer_classes(self) -> bool:
        return all(isinstance(c, int) and not isinstance(c, bool) for c in self.classes)

    def describe(self) -> dict[str, Any]:
        """The metadata's ``layout`` entry."""
        meaning = _AS_DRAWN if self.as_drawn and self.kind != "exact" else _MEANING[self.kind]
        return {
            "feature_columns": list(self.features),
            "label_column": self.label,
            "label_kind": self.kind,
            "label_columns": self.label_columns,
            # Per label column, the class it is about (null: the column holds the class).
            "label_column_classes": [None] if self.kind == "exact" else list(self.classes),
            "label_meaning": meaning,
            "as_drawn": self.as_drawn,
            "npz": _NPZ,
            **(
                {
                    "table_columns": [c.describe() for c in self.table],
                    "table_meaning": table_schema.DESCRIPTION,
                }
                if self.table
                else {}
            ),
        }

    def labels(self, Y: np.ndarray) -> np.ndarray:
        """The label matrix a file carries (NPZ ``y``): the proportions for ``proportions``
        (unless as drawn), the values otherwise; ``exact`` is checked to be one-hot."""
        Y = np.asarray(Y)
        if self.kind == "exact":
            hot = (Y == 0) | (Y == 1)
            if not (hot.all() and (Y.sum(axis=1) == 1).all()):
                # A spec declaring exact labels for a mechanism whose labels are noisy is a
                # programming error: fail before anything is stored.
                raise LayoutError("a mechanism declared exact labels but drew non-one-hot ones")
            return Y
        if self.kind == "proportions" and not self.as_drawn:
            return category_proportions(Y, [range(Y.shape[1])])
        return Y

    def class_values(self, Y: np.ndarray) -> list[Any]:
        """``exact``: each row's class (its one-hot's position, named as declared)."""
        index = np.asarray(Y).argmax(axis=1)
        if self.integer_classes:
            return np.asarray(self.classes, dtype=np.int64)[index].tolist()  # type: ignore[no-any-return]
        names = [str(c) for c in self.classes]
        return [names[i] for i in index]


def class_columns(label: str, classes: Sequence[Any]) -> list[str]:
    return [f"{label}={c}" for c in classes]


def collisions(
    features: Sequence[str],
    label: str | None,
    classes: Sequence[Any],
    kinds: Sequence[LabelKind] = LABEL_KINDS,
) -> list[str]:
    """The label column names (of any of ``kinds``) that repeat a feature name or each
    other: a table with repeated names is ambiguous (CSV readers rename them silently)."""
    name = label or DEFAULT_LABEL
    taken = set(features)
    wanted: list[str] = []
    if "exact" in kinds:
        wanted.append(name)
    if any(k != "exact" for k in kinds):
        wanted.extend(class_columns(name, classes))
    seen: set[str] = set()
    clash = []
    for column in wanted:
        if column in taken or column in seen:
            clash.append(column)
        seen.add(column)
    return clash


def read_layout(metadata: Mapping[str, Any]) -> Layout | None:
    """The layout a release's metadata states (None: a release made before layouts, whose
    columns are ``x_<feature>``, ``y_<class>``)."""
    entry = metadata.get("layout")
    if not isinstance(entry, Mapping):
        return None
    kind = entry.get("label_kind")
    if kind not in LABEL_KINDS:
        raise LayoutError(f"the release's layout has an unknown label kind {kind!r}")
    table: tuple[TableColumn, ...] = ()
    if entry.get("table_columns"):
        declared = metadata.get("declared_columns")
        if not isinstance(declared, list):
            raise LayoutError("the release's layout names table columns but no declared_columns")
        table = table_schema.table_columns(declared)
        if [c.name for c in table] != [c.get("name") for c in entry["table_columns"]]:
            raise LayoutError("the release's table columns do not match its declared_columns")
    return Layout(
        tuple(entry["feature_columns"]),
        str(entry["label_column"]),
        kind,
        tuple(metadata.get("classes") or ()),
        bool(entry.get("as_drawn", False)),
        table,
    )


def one_hot(layout: Layout, values: Sequence[Any]) -> np.ndarray:
    """An exact label column (classes as read from a file: ints or text) as one-hot rows,
    matched to the declared classes by their text (a CSV reader may read "1" for 1)."""
    lookup = {str(c): i for i, c in enumerate(layout.classes)}
    index = np.empty(len(values), dtype=np.int64)
    for row, value in enumerate(values):
        key = str(value.item() if hasattr(value, "item") else value)
        if key not in lookup:
            raise LayoutError(f"label {key!r} in row {row} is not among the release's classes")
        index[row] = lookup[key]
    return np.eye(len(layout.classes))[index]


def table_rows(
    table: Any, layout: Layout, metadata: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """X (encoded features) and the label matrix Y of a CSV or Parquet table (or record
    batch) written with ``layout``: a declared table re-encoded as its upload was, an exact
    label column as one-hot rows. Raises ``LayoutError`` when the columns do not match."""
    names = table.column_names if hasattr(table, "column_names") else table.schema.names
    absent = [c for c in layout.columns if c not in names]
    if absent:
        raise LayoutError(
            f"no column(s) {absent[:5]} of the release's layout (found {list(names)[:10]})"
        )
    if layout.table:
        frame = table.select(layout.table_names).to_pandas()
        try:
            X = encode_declared(frame, metadata["declared_columns"])
        except DeclaredValueError as exc:
            raise LayoutError(str(exc)) from None
    else:
        X = stack_columns(table, layout.features)
    if layout.kind == "exact":
        Y = one_hot(layout, table.column(layout.label).to_pylist())
    else:
        Y = stack_columns(table, layout.label_columns)
    return X, Y


def stack_columns(table: Any, columns: Sequence[str]) -> np.ndarray:
    """A table's (or record batch's) numeric ``columns`` as one float64 matrix."""
    if not columns:
        return np.zeros((table.num_rows, 0))
    return np.column_stack([table.column(c).to_numpy() for c in columns]).astype(np.float64)


def text_columns(layout: Layout | None) -> list[str]:
    """The columns to read from a CSV as text: an exact label column and a table's
    categorical columns, matched by their text (a class or category "001" is not 1)."""
    if layout is None:
        return []
    text = [c.name for c in layout.table if c.type == "categorical"]
    return [*text, layout.label] if layout.kind == "exact" else text
