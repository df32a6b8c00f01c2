"""Decoding declared categorical columns in a release.

An upload's categorical column is one-hot encoded into one feature per declared category; a
drawn row holds a noisy mixture of such blocks. Reading each block as the mixture's
category proportions (negative parts set to 0, then scaled to sum to 1) is post-processing
of the release: it reads nothing but the released values, so it costs no privacy. A release
serves one category per row drawn from them (``dpcore.domain``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

DECODING = (
    "each categorical column's one-hot features '<column>=<category>' hold one category per "
    "row (1 on it, 0 elsewhere), drawn from the released block's proportions (negative values "
    "set to 0, scaled to sum to 1; uniform where nothing positive is left): post-processing "
    "of the rows as drawn, which the owner's raw copy keeps"
)


def category_proportions(X: np.ndarray, blocks: Sequence[Sequence[int]]) -> np.ndarray:
    """``X`` with each block of columns replaced by its proportions (a copy; float32 stays
    float32). Positive scaling of a row (unit scaling, L2 row clipping) leaves them as they
    were, so the one-hot blocks decode alike whatever the mechanism scaled rows by."""
    out = np.array(X, copy=True)
    for block in blocks:
        idx = list(block)
        part = np.clip(out[:, idx], 0.0, None)
        total = part.sum(axis=1, keepdims=True)
        uniform = np.full_like(part, 1.0 / len(idx))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, idx] = np.where(total > 0, part / np.where(total > 0, total, 1.0), uniform)
    return out


# --- encoding records by a declared column schema (shared by upload parsing and evaluation) ---


class DeclaredValueError(ValueError):
    """A value the declaration does not allow (an undeclared category, a gap without a
    policy). Messages name the column and the declared set, never the value."""


def category_key(value: Any) -> str | None:
    """A cell's text as categories are matched: strings as they are, integers (and whole
    floats, which is what Parquet integers with nulls become) in decimal; anything else
    matches no category."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating) and math.isfinite(value) and value == int(value):
        return str(int(value))
    return None


def _some(items: Sequence[Any], limit: int = 10) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    more = f", … ({len(items)} in all)" if len(items) > limit else ""
    return f"[{shown}{more}]"


def one_hot_column(
    column: pd.Series, name: str, categories: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """One-hot over the declared categories and the missing mask. Each distinct value is
    looked up once (pandas factorises the column), so a long column costs one pass."""
    import pandas as pd

    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    position: dict[str | None, int] = {str(c): k for k, c in enumerate(categories)}
    lookup = np.array(
        [position.get(category_key(u), -1) for u in np.asarray(uniques, dtype=object)],
        dtype=np.int64,
    )
    gaps = codes < 0
    index = np.full(len(codes), -1, dtype=np.int64)
    index[~gaps] = lookup[codes[~gaps]] if len(lookup) else -1
    if (index[~gaps] < 0).any():
        # Neither the value nor its row: the value is the data (private), and naming the
        # column and the declared set (public) says what to fix.
        raise DeclaredValueError(
            f"column {name!r} holds a value that is not among its declared categories "
            f"{_some(list(categories))}; declare every category the column may hold"
        )
    onehot = np.zeros((len(codes), len(categories)), dtype=np.float64)
    held = np.flatnonzero(~gaps)
    onehot[held, index[held]] = 1.0
    return onehot, gaps


def fill_missing(
    block: np.ndarray,
    gaps: np.ndarray,
    name: str,
    missing: Mapping[str, Any] | None,
    *,
    bounds: Sequence[float] | None = None,
    categories: Sequence[Any] | None = None,
) -> None:
    """Write the declared fill into a column's features (a view of X) where entries are
    missing (``missing``: the policy as declared, {"policy": "constant", "value": …} or
    {"policy": "indicator", "fill": …}); a missing entry without a policy is refused.
    ``bounds`` for a numeric column (no fill: the middle of its bounds), ``categories`` for a
    categorical one (no fill: no category)."""
    if not gaps.any():
        return
    if missing is None:
        raise DeclaredValueError(
            f"column {name!r} is missing a value in row {int(np.argmax(gaps)) + 1}; "
            'declare a missing-value policy for it ("missing": {"policy": "constant", '
            '"value": …} or {"policy": "indicator"})'
        )
    fill = missing.get("value") if missing.get("policy") == "constant" else missing.get("fill")
    if categories is None:
        assert bounds is not None
        lo, hi = bounds
        block[gaps, 0] = (lo + hi) / 2 if fill is None else float(fill)
        return
    block[gaps, :] = 0.0  # no category; an indicator column says the entry was missing
    if fill is not None:
        texts = [str(c) for c in categories]
        key = fill if isinstance(fill, str) else str(int(fill))
        block[gaps, texts.index(key)] = 1.0  # the schema checked it is declared


def encoded_names(declared: Sequence[Mapping[str, Any]]) -> list[str]:
    """The features a declaration encodes to, in order: a numeric column is itself; a
    categorical column one feature ``<name>=<category>`` per declared category; an indicator
    policy adds ``<name>_missing`` after the column's features."""
    names: list[str] = []
    for column in declared:
        if column["type"] == "numeric":
            names.append(column["name"])
        else:
            names.extend(f"{column['name']}={c}" for c in column["categories"])
        if (column.get("missing") or {}).get("policy") == "indicator":
            names.append(f"{column['name']}_missing")
    return names


def column_count(declared: Sequence[Mapping[str, Any]]) -> int:
    """The columns a declaration encodes to, each categorical column's one-hot block counted
    once and each missing-value indicator once (``encoded_names`` with every block one)."""
    indicators = sum(
        (column.get("missing") or {}).get("policy") == "indicator" for column in declared
    )
    return len(declared) + indicators


def columns_of(n_features: int, blocks: Sequence[Sequence[int]]) -> int:
    """The same count from an encoded table's width and its categorical blocks."""
    return n_features - sum(len(block) - 1 for block in blocks)


def encode_declared(frame: pd.DataFrame, declared: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Records of a table whose columns are the declared ones (``declared``: the release
    metadata's ``declared_columns``) encoded as an upload is: numeric columns as numbers,
    categorical ones one-hot, gaps by each column's policy, in ``encoded_names`` order. Public
    facts only — how an analyst's held-out rows meet a release."""
    import pandas as pd

    absent = [c["name"] for c in declared if c["name"] not in frame.columns]
    if absent:
        raise DeclaredValueError(f"the table lacks the declared columns {_some(absent)}")
    X = np.empty((len(frame), len(encoded_names(declared))), dtype=np.float64)
    j = 0
    for column in declared:
        name, missing = column["name"], column.get("missing")
        if column["type"] == "numeric":
            values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64)
            gaps = frame[name].isna().to_numpy()
            if np.isnan(values[~gaps]).any():
                raise DeclaredValueError(f"column {name!r} holds a value that is not a number")
            X[:, j] = values
            fill_missing(X[:, j : j + 1], gaps, name, missing, bounds=column["bounds"])
            j += 1
        else:
            onehot, gaps = one_hot_column(frame[name], name, column["categories"])
            width = len(column["categories"])
            X[:, j : j + width] = onehot
            fill_missing(X[:, j : j + width], gaps, name, missing, categories=column["categories"])
            j += width
        if (missing or {}).get("policy") == "indicator":
            X[:, j] = gaps
            j += 1
    return X
