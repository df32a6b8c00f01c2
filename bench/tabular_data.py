"""The tabular study's datasets (bench/tabular.py), each uploaded as an owner would upload it.

breast-cancer (569 × 30, 2 classes) and wine (178 × 13, 3 classes): NPZ with per-column bounds;
digits (1797 × 8 × 8, 10 classes): NPZ of 8 × 8 images with the documented pixel range [0, 16];
make_classification ("mixed", n = 50 000): a CSV with declared columns — two categorical
columns derived from informative features (3 and 5 categories, so they carry signal) and 5 %
missing values (MCAR) in three numeric columns under the two missing-value policies — parsed
by the service's own parser (``service.datasets.parsing.parse_dataset``); patients (n = 4 000,
a hospital-style CSV: two categorical columns, one never-seen category, integer columns, gaps
under both missing-value policies, a binary outcome), parsed alike.

Each table is split once (stratified, 70 % private / 30 % held-out test, seed 0). The held-out
rows go through the same public encoding as the private ones: for the NPZ tables the raw
features as they are, for the CSV table the held-out CSV parsed with the *same* declaration
(one-hot over the declared categories, the declared missing-value fill, clipping to the
declared bounds) — the encoder an owner's upload goes through, applied with public facts only.

Bounds: digits' range is documented; for the others they stand in for what an owner reads off
a data dictionary — each column's range over the whole table widened by 5 % on each side (a
study shortcut: a real owner must not take them from the private rows).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.datasets.parsing import ParsedDataset, parse_dataset
from service.datasets.schemas import Budget, DatasetMetadata

MIXED_ROWS = 50_000
MISSING_SHARE = 0.05
# Missing-value policies of the mixed table's gappy numeric columns (both kinds the schema has).
MISSING_POLICIES: dict[str, dict[str, Any]] = {
    "x2": {"policy": "indicator"},
    "x3": {"policy": "constant", "value": 0.0},
    "x5": {"policy": "indicator"},
}
CATEGORIES = {"colour": ["red", "green", "blue"], "grade": ["A", "B", "C", "D", "E"]}


@dataclass(frozen=True)
class Table:
    """One study dataset: the private part as parsed, the held-out part encoded alike (raw
    units, the declared encoding), its labels as in the file."""

    name: str
    private: ParsedDataset
    X_test: np.ndarray
    y_test: np.ndarray

    @property
    def image(self) -> bool:
        return len(self.private.feature_shape) == 2


def _split(n: int, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(n), test_size=0.3, stratify=y, random_state=0)
    return np.sort(train), np.sort(test)


def declared_bounds(X: np.ndarray) -> np.ndarray:
    """The study's stand-in for a data dictionary: the table's range widened 5 % per side."""
    lo, hi = np.nanmin(X, axis=0), np.nanmax(X, axis=0)
    pad = 0.05 * np.maximum(hi - lo, 1e-9)
    return np.stack([lo - pad, hi + pad], axis=1)


def _npz_table(name: str, X: np.ndarray, y: np.ndarray, bounds: np.ndarray) -> Table:
    train, test = _split(len(X), y)
    buffer = io.BytesIO()
    np.savez(buffer, X=X[train].astype(np.float64), y=y[train])
    meta = DatasetMetadata(
        name=name,
        feature_range={str(j): (float(lo), float(hi)) for j, (lo, hi) in enumerate(bounds)},
        classes=sorted(int(c) for c in np.unique(y)),
        budget=Budget(epsilon=100, delta=0.5),
    )
    parsed = parse_dataset(
        content=buffer.getvalue(), filename=f"{name}.npz", metadata=meta, max_bytes=10**9
    )
    return Table(name, parsed, X[test].reshape(len(test), -1).astype(np.float64), y[test])


def breast_cancer(rows: int | None = None) -> Table:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return _npz_table("breast_cancer", X, y, declared_bounds(X))


def wine(rows: int | None = None) -> Table:
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    return _npz_table("wine", X, y, declared_bounds(X))


def digits(rows: int | None = None) -> Table:
    from sklearn.datasets import load_digits

    data = load_digits()
    images, y = data.images, data.target
    return _npz_table("digits", images, y, np.array([[0.0, 16.0]] * 64))


def mixed_frame(rows: int = MIXED_ROWS) -> Any:
    """make_classification (20 features: 4 informative, 2 redundant, unshuffled so x0–x3 are
    informative; random_state 0) as a table: x0 binned at its terciles into ``colour``, x1 at
    its quintiles into ``grade``, 5 % of x2, x3 and x5 blanked (MCAR, seed 1); label ``y``."""
    import pandas as pd
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=rows,
        n_features=20,
        n_informative=4,
        n_redundant=2,
        shuffle=False,
        random_state=0,
    )
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
    for column, source in (("colour", "x0"), ("grade", "x1")):
        names = CATEGORIES[column]
        edges = np.quantile(frame[source], np.linspace(0, 1, len(names) + 1)[1:-1])
        frame[column] = np.asarray(names, dtype=object)[np.searchsorted(edges, frame[source])]
    frame = frame.drop(columns=["x0", "x1"])
    rng = np.random.default_rng(1)
    for column in MISSING_POLICIES:
        frame.loc[rng.random(rows) < MISSING_SHARE, column] = np.nan
    frame["y"] = y
    return frame


def mixed_columns(frame: Any) -> list[dict[str, Any]]:
    """The declaration an owner sends as ``columns``: categorical columns with their category
    sets, numeric ones with bounds (``declared_bounds``) and the missing-value policies."""
    columns: list[dict[str, Any]] = []
    for name in frame.columns:
        if name == "y":
            continue
        if name in CATEGORIES:
            columns.append({"name": name, "type": "categorical", "categories": CATEGORIES[name]})
            continue
        ((lo, hi),) = declared_bounds(frame[[name]].to_numpy(dtype=np.float64))
        column: dict[str, Any] = {"name": name, "type": "numeric", "bounds": [lo, hi]}
        if name in MISSING_POLICIES:
            column["missing"] = MISSING_POLICIES[name]
        columns.append(column)
    return columns


def _parse_csv(name: str, frame: Any, columns: list[dict[str, Any]]) -> ParsedDataset:
    meta = DatasetMetadata.model_validate(
        {
            "name": name,
            "label_column": "y",
            "columns": columns,
            "classes": [0, 1],
            "budget": {"epsilon": 100, "delta": 0.5},
        }
    )
    content = frame.to_csv(index=False).encode()  # NaN → an empty cell: missing
    return parse_dataset(content=content, filename=f"{name}.csv", metadata=meta, max_bytes=10**9)


def mixed(rows: int | None = None) -> Table:
    frame = mixed_frame(rows or MIXED_ROWS)
    columns = mixed_columns(frame)
    train, test = _split(len(frame), frame["y"].to_numpy())
    private = _parse_csv("mixed", frame.iloc[train], columns)
    # The held-out rows through the same declaration: the public encoder, nothing learnt.
    held_out = _parse_csv("mixed-test", frame.iloc[test], columns)
    y_test = np.asarray(held_out.classes)[held_out.labels]
    return Table("make_classification", private, held_out.X, y_test)


PATIENT_ROWS = 4_000
PATIENT_COLUMNS: list[dict[str, Any]] = [
    {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
    {"name": "ward", "type": "categorical", "categories": ["A", "B", "C", "D"]},
    {
        "name": "age",
        "type": "numeric",
        "bounds": [18, 100],
        "integer": True,
        "missing": {"policy": "indicator"},
    },
    {"name": "systolic", "type": "numeric", "bounds": [80, 200]},
    {
        "name": "lactate",
        "type": "numeric",
        "bounds": [0, 10],
        "missing": {"policy": "constant", "value": 1.5},
    },
    {"name": "visits", "type": "numeric", "bounds": [0, 30], "integer": True},
]


def patients_frame(rows: int = PATIENT_ROWS) -> Any:
    """A hospital-style table: sex, ward (D declared, never present), an integer age with 8 %
    gaps (indicator policy), systolic pressure, lactate with 5 % gaps (a constant fill), an
    integer count of earlier visits; the outcome (about half the rows) more likely with high
    lactate, age, visits and in ward C (seed 2). Bounds are a data dictionary's, not read off
    the rows."""
    import pandas as pd

    rng = np.random.default_rng(2)
    sex = rng.choice(["F", "M"], size=rows)
    ward = rng.choice(["A", "B", "C"], size=rows, p=[0.5, 0.3, 0.2])
    age = rng.integers(18, 96, size=rows)
    systolic = np.clip(rng.normal(130, 18, rows), 85, 195).round(1)
    lactate = np.clip(rng.gamma(2.0, 1.0, rows), 0.1, 9.9).round(2)
    visits = np.minimum(rng.poisson(2 + (age - 18) / 30), 30)
    score = (
        0.9 * (lactate - 2)
        + 0.03 * (age - 55)
        + 0.25 * visits
        + 0.8 * (ward == "C")
        + 0.02 * (systolic - 130)
        + 0.3 * (sex == "M")
    )
    outcome = (rng.random(rows) < 1 / (1 + np.exp(-(score - 1.2)))).astype(int)
    age_col = age.astype(object)
    age_col[rng.random(rows) < 0.08] = None
    lactate_col = lactate.astype(object)
    lactate_col[rng.random(rows) < 0.05] = None
    return pd.DataFrame(
        {
            "sex": sex,
            "ward": ward,
            "age": age_col,
            "systolic": systolic,
            "lactate": lactate_col,
            "visits": visits,
            "y": outcome,
        }
    )


def patients(rows: int | None = None) -> Table:
    frame = patients_frame(rows or PATIENT_ROWS)
    train, test = _split(len(frame), frame["y"].to_numpy())
    private = _parse_csv("patients", frame.iloc[train], PATIENT_COLUMNS)
    held_out = _parse_csv("patients-test", frame.iloc[test], PATIENT_COLUMNS)
    y_test = np.asarray(held_out.classes)[held_out.labels]
    return Table("patients", private, held_out.X, y_test)


DATASETS: dict[str, Callable[[int | None], Table]] = {
    "breast_cancer": breast_cancer,
    "wine": wine,
    "digits": digits,
    "make_classification": mixed,
    "patients": patients,
}
