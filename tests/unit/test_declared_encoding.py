"""Held-out rows meet a release the way its upload was encoded (issue 15): the declared-column
encoder shared by upload parsing and ``dprelease evaluate``, and soft labels as weighted rows
(a rare class no mixture's argmax carries still reaches the model)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpcore.categorical import DeclaredValueError, encode_declared, encoded_names
from dpcore.evaluation import FAMILIES, TrainingSet, load_records, weighted_rows
from service.datasets.parsing import parse_dataset
from service.datasets.schemas import Budget, DatasetMetadata

DECLARED: list[dict[str, Any]] = [
    {"name": "sex", "type": "categorical", "categories": ["F", "M"], "missing": None},
    {
        "name": "ward",
        "type": "categorical",
        "categories": ["A", "B", "NA"],
        "missing": {"policy": "indicator", "fill": None},
    },
    {
        "name": "age",
        "type": "numeric",
        "bounds": [0.0, 100.0],
        "missing": {"policy": "constant", "value": 40.0},
    },
]
CSV = "sex,ward,age,outcome\nF,A,30,0\nM,,,1\nF,NA,70,0\nM,B,55,1\n"


def test_the_evaluation_encoder_matches_the_upload_parser() -> None:
    meta = DatasetMetadata(
        name="t",
        label_column="outcome",
        columns=DECLARED,  # type: ignore[arg-type]
        classes=[0, 1],
        budget=Budget(epsilon=1, delta=1e-5),
    )
    parsed = parse_dataset(content=CSV.encode(), filename="t.csv", metadata=meta, max_bytes=10**6)
    frame = pd.read_csv(
        io.StringIO(CSV),
        dtype={"sex": str, "ward": str, "outcome": str},
        keep_default_na=False,
        na_values=[""],
    )
    X = encode_declared(frame, DECLARED)
    np.testing.assert_array_equal(X, parsed.X)
    assert encoded_names(DECLARED) == list(parsed.feature_names)
    # "NA" is a declared category (read as text), the empty cell is the gap.
    assert X[2, encoded_names(DECLARED).index("ward=NA")] == 1.0
    assert X[1, encoded_names(DECLARED).index("ward_missing")] == 1.0
    assert X[1, encoded_names(DECLARED).index("age")] == 40.0


def test_load_records_encodes_a_table_in_the_declared_columns(tmp_path: Any) -> None:
    path = tmp_path / "test.csv"
    path.write_text(CSV)
    X, y = load_records(path, label_column="outcome", declared=DECLARED)
    assert X.shape == (4, len(encoded_names(DECLARED)))
    assert list(y) == ["0", "1", "0", "1"]


def test_an_undeclared_category_names_the_column_not_the_value() -> None:
    frame = pd.DataFrame({"sex": ["X-secret"], "ward": ["A"], "age": [3.0]})
    with pytest.raises(DeclaredValueError) as caught:
        encode_declared(frame, DECLARED)
    assert "'sex'" in str(caught.value) and "X-secret" not in str(caught.value)


def test_weighted_rows_only_for_mixtures() -> None:
    X = np.arange(6.0).reshape(3, 2)
    assert weighted_rows(X, np.eye(2)[[0, 1, 0]]) is None  # one-hot: hard labels say it
    soft = np.array([[0.9, 0.1], [0.7, 0.3], [1.2, -0.2]])
    out = weighted_rows(X, soft)
    assert out is not None
    rows, classes, weights = out
    assert len(rows) == len(classes) == len(weights) == 5  # the −0.2 entry carries nothing
    np.testing.assert_allclose(np.bincount(np.repeat([0, 1, 2], [2, 2, 1]), weights), 1.0)


def test_a_rare_class_no_mixture_argmax_holds_still_gets_scores() -> None:
    """Mixtures of 16 records of a 5 % outcome: every row's argmax is the common class, so
    hard labels could only predict it (no ROC AUC); weighted, the model ranks test rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    share = 0.4 / (1 + np.exp(-(X[:, 0] * 2 - 3)))  # grows with x0, never the majority
    Y = np.column_stack([1 - share, share])
    assert (Y.argmax(axis=1) == 0).all()
    Xt = rng.normal(size=(300, 2))
    data = TrainingSet(X, Y, Xt, None, soft=True, epochs=1, seed=0)
    prediction = FAMILIES["logistic"](data)
    assert prediction.scores is not None
    # The ranking follows x0, as the mixtures' shares do.
    from scipy.stats import spearmanr

    assert spearmanr(prediction.scores[:, 1], Xt[:, 0]).statistic > 0.9
    hard = FAMILIES["logistic"](TrainingSet(X, np.eye(2)[Y.argmax(axis=1)], Xt, None, True, 1, 0))
    assert hard.scores is None  # one class: nothing to rank with
