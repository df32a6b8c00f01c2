"""bench/records_study.py: its per-release shares (distinct rows; rows within the declared
bounds, only for releases in the data's units) and one release scored end to end."""

from __future__ import annotations

import numpy as np
import pytest

from bench import records_study, tabular_data
from dpcore.evaluation import Release


def _release(X: np.ndarray, output: str = "raw") -> Release:
    metadata = {
        "mechanism": "toy",
        "params": {},
        "classes": [0, 1],
        "transform": {"output": output, "lo": [0.0, -1.0], "hi": [1.0, 1.0]},
    }
    return Release(X, np.eye(2)[np.arange(len(X)) % 2], metadata)


def test_shares_of_distinct_and_in_domain_rows() -> None:
    X = np.array([[0.0, -1.0], [1.0, 1.0], [0.5, 0.0], [0.5, 0.0], [1.2, 0.0], [0.5, -1.5]])
    assert records_study.distinct_share(X) == 5 / 6
    assert records_study.in_domain_share(_release(X)) == 4 / 6
    # A value at a bound after float32 storage is within it; a release in another space has
    # no share (its values are not the data's).
    edge = np.array([[np.float32(1.0 + 1e-8), np.float32(-1.0)]], dtype=np.float64)
    assert records_study.in_domain_share(_release(edge)) == 1.0
    assert records_study.in_domain_share(_release(X, output="centred")) is None


def test_a_default_release_is_scored_by_every_table_family() -> None:
    table = tabular_data.DATASETS["wine"](None)
    row = records_study.run_release(table, "clustmix", 4.0)
    assert row["note"] == ""
    scores = {f: row[f] for f in records_study.TABLE_FAMILIES}
    assert row.get("cnn") is None  # the CNN trains on image-shaped releases only
    assert set(scores) == {
        "linear",
        "logistic",
        "sklearn_mlp",
        "hgb",
        "random_forest",
        "knn",
        "mlp",
    }
    assert row["worst"] == min(scores.values()) and 0 <= row["worst"] <= 1
    assert row["rows"] == table.private.n_rows  # T = n
    assert row["in_domain"] == 1.0 and row["distinct"] >= 0.9
    assert abs(row["charge"] - 4.0) < 1e-3 and row["charge"] <= 4.0


def test_the_table_averages_repeats_and_names_the_worst_family() -> None:
    base = {"dataset": "t", "mechanism": "m", "config": "defaults", "epsilon": 1.0, "note": ""}
    scores = [
        {f: 0.8 for f in records_study.FAMILY_KEYS} | {"knn": 0.5, "worst": 0.5},
        {f: 0.9 for f in records_study.FAMILY_KEYS} | {"hgb": 0.6, "worst": 0.6},
    ]
    rows = [{**base, "repeat": i, "rows": 10, **s} for i, s in enumerate(scores)]
    (summary,) = records_study.summarise(rows)
    assert summary["repeats"] == 2 and summary["rows"] == 10
    assert summary["knn"] == pytest.approx(0.7) and summary["hgb"] == pytest.approx(0.7)
    assert summary["logistic"] == pytest.approx(0.85)
    # The lowest mean, not the mean of the repeats' worst families (0.55).
    assert summary["worst"] == pytest.approx(0.7)
    assert summary["worst_range"] == "0.500–0.600"
    assert "| m | 1 | 10 | — | — | 0.850 |" in records_study.markdown(rows, "cmd")
