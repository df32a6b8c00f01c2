"""Declared columns (issue 15, item 1): encoding at parsing, storage, and release decoding."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcore.categorical import category_proportions
from service.datasets.parsing import parse_dataset
from service.datasets.schemas import DatasetMetadata, declared_columns
from service.datasets.service import _jsonable_range


def _meta(columns: list[dict[str, Any]]) -> DatasetMetadata:
    return DatasetMetadata.model_validate(
        {
            "name": "t",
            "label_column": "y",
            "columns": columns,
            "classes": [0, 1],
            "budget": {"epsilon": 1, "delta": 1e-5},
        }
    )


def _parse(csv: bytes, meta: DatasetMetadata) -> Any:
    return parse_dataset(content=csv, filename="d.csv", metadata=meta, max_bytes=1 << 20)


def test_one_hot_missing_and_clipping_in_declaration_order() -> None:
    meta = _meta(
        [
            {
                "name": "age",
                "type": "numeric",
                "bounds": [0, 100],
                "missing": {"policy": "indicator"},
            },
            {
                "name": "sex",
                "type": "categorical",
                "categories": ["F", "M", "NA"],  # "NA" is a category: only empty cells miss
                "missing": {"policy": "indicator"},
            },
        ]
    )
    # File order differs from the declaration's: features follow the declaration.
    parsed = _parse(b"sex,y,age\nF,0,34\nNA,1,\n,0,130\n", meta)
    assert parsed.feature_names == ["age", "age_missing", "sex=F", "sex=M", "sex=NA", "sex_missing"]
    assert parsed.X.tolist() == [
        [34, 0, 1, 0, 0, 0],
        [50, 1, 0, 0, 1, 0],  # the default fill: the bounds' midpoint
        [100, 0, 0, 0, 0, 1],  # clipped; a missing category is an all-zero block
    ]
    assert parsed.clipped_values == 1
    assert parsed.categorical_blocks == ((2, 3, 4),)
    assert parsed.lo.tolist() == [0, 0, 0, 0, 0, 0] and parsed.hi.tolist() == [100, 1, 1, 1, 1, 1]


def test_stored_declaration_round_trips_and_old_ranges_are_not_columns() -> None:
    meta = _meta([{"name": "ward", "type": "categorical", "categories": [1, "b"]}])
    stored = _jsonable_range(meta)
    assert declared_columns(stored) == meta.columns
    assert declared_columns([0, 13]) is None
    assert declared_columns({"a": [0, 1]}) is None


def test_category_proportions() -> None:
    X = np.array([[0.5, -0.2, 0.6, 7.0], [-1.0, -1.0, -1.0, 3.0]], dtype=np.float32)
    out = category_proportions(X, [(0, 1, 2)])
    assert out.dtype == np.float32
    assert np.allclose(out[0], [0.5 / 1.1, 0.0, 0.6 / 1.1, 7.0])
    assert np.allclose(out[1], [1 / 3, 1 / 3, 1 / 3, 3.0])  # nothing positive: uniform
    assert np.allclose(category_proportions(2.5 * X, [(0, 1, 2)])[:, :3], out[:, :3])
