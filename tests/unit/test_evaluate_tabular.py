"""``dprelease evaluate`` for tabular users (issue 15.4): releases and test files in NPZ, CSV
and Parquet; accuracy, balanced accuracy and ROC AUC beside a majority-class row and a
non-private reference; one result line per classifier as it finishes; the CNN refused on
tabular data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import dprelease_cli.evaluate_cmd as evaluate_cmd
from dpcore import evaluation
from dpcore.artifacts import ArtifactWriter
from dpcore.evaluation import Release, evaluate, load_records, load_release_file
from dpcore.preprocessing import one_hot, unit_features
from dpcore.release_layout import Layout
from dprelease_cli.main import cli

D = 5
FEATURES = [f"f{i}" for i in range(D)]


def _imbalanced(n: int, seed: int, positives: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Raw records in [0, 10]^5, 5 % positives; a positive's first feature is higher (with
    overlap), so a model ranks well but still misses positives at the 0.5 threshold."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < positives).astype(int)
    X = rng.uniform(0, 6, size=(n, D))
    X[:, 0] += 3.0 * y
    return X, y


def _metadata(classes: list[Any]) -> dict[str, Any]:
    return {
        "mechanism": "toy",
        "params": {},
        "classes": classes,
        "feature_shape": [D],
        "feature_names": FEATURES,
        "feature_range": {"lo": [0.0] * D, "hi": [10.0] * D},
    }


def _write_release(path: Path, fmt: str, X_raw: np.ndarray, y: np.ndarray) -> Release:
    """A release file exactly as the worker writes one (its own ArtifactWriter)."""
    layout = Layout.of(FEATURES, "label", "proportions", [0, 1])
    meta = {**_metadata([0, 1]), "layout": layout.describe()}
    X = unit_features(X_raw, np.zeros(D), np.full(D, 10.0))
    Y = one_hot(y, 2)
    with ArtifactWriter(fmt, path, rows=len(X), layout=layout, metadata=meta) as writer:
        for start in range(0, len(X), 128):  # in chunks, as the worker does
            writer.write(X[start : start + 128], Y[start : start + 128])
    return Release(X, Y, meta)


def _write_table(path: Path, X: np.ndarray, y: np.ndarray, label: str = "label") -> None:
    columns = {name: X[:, i] for i, name in enumerate(FEATURES)}
    table = pa.table({label: y, **columns})  # label first: features are found by name
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        pacsv.write_csv(table, path)


@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_release_files_read_back_in_every_format(tmp_path: Path, fmt: str) -> None:
    X_raw, y = _imbalanced(300, 0)
    written = _write_release(tmp_path / f"release.{fmt}", fmt, X_raw, y)
    # A CSV release carries no metadata: the metadata.json artifact beside it is given.
    given = written.metadata if fmt == "csv" else None
    release = load_release_file(tmp_path / f"release.{fmt}", given)
    np.testing.assert_allclose(release.X, written.X, rtol=1e-6)  # float32 on disk
    np.testing.assert_array_equal(release.Y, written.Y)
    assert release.metadata == written.metadata


def test_a_csv_release_uses_given_metadata(tmp_path: Path) -> None:
    X_raw, y = _imbalanced(200, 0)
    written = _write_release(tmp_path / "release.csv", "csv", X_raw, y)
    release = load_release_file(tmp_path / "release.csv", written.metadata)
    assert release.metadata == written.metadata
    wrong = {**written.metadata, "classes": [0, 1, 2]}
    wrong["layout"] = Layout.of(FEATURES, "label", "proportions", [0, 1, 2]).describe()
    with pytest.raises(ValueError, match=r"no column\(s\) \['label=2'\]"):
        load_release_file(tmp_path / "release.csv", wrong)


def test_test_records_from_npz_csv_and_parquet(tmp_path: Path) -> None:
    X, y = _imbalanced(50, 1)
    np.savez(tmp_path / "t.npz", X=X, y=y)
    _write_table(tmp_path / "t.csv", X, y)
    _write_table(tmp_path / "t.parquet", X, y, label="outcome")
    for path, label in [("t.npz", None), ("t.csv", None), ("t.parquet", "outcome")]:
        X_read, y_read = load_records(tmp_path / path, label_column=label, feature_names=FEATURES)
        np.testing.assert_allclose(X_read, X)
        assert [int(v) for v in y_read] == y.tolist()
    with pytest.raises(ValueError, match="no label column"):
        load_records(tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="no column 'nope'"):
        load_records(tmp_path / "t.csv", label_column="nope")


def test_imbalanced_metrics_against_the_majority_row(tmp_path: Path) -> None:
    X_raw, y = _imbalanced(1000, 0)
    release = _write_release(tmp_path / "r.npz", "npz", X_raw, y)
    X_test, y_test = _imbalanced(2000, 1)
    report = evaluate(release, X_test, y_test, classifiers=("logistic", "hgb"))
    majority = report["majority"]
    # Predicting the release's majority class for everyone: ~95 % accuracy, which is why
    # accuracy alone says nothing here; balanced accuracy and AUC say "no skill".
    assert majority["class"] == 0
    assert majority["accuracy"] == pytest.approx(1 - y_test.mean())
    assert majority["accuracy"] > 0.93
    assert majority["balanced_accuracy"] == 0.5
    assert majority["roc_auc"] == 0.5
    acc, balanced, auc = (report[m] for m in ("accuracy", "balanced_accuracy", "roc_auc"))
    # Logistic regression at its default threshold predicts "negative" for (nearly) everyone:
    # its accuracy is the majority row's, and only balanced accuracy says so; its ROC AUC
    # shows that it still ranks positives well (a threshold away from useful).
    assert acc["logistic"] > 0.93 and balanced["logistic"] < 0.55
    assert auc["logistic"] > 0.8
    # Gradient boosting finds some positives: balanced accuracy well above 0.5 and well
    # below its accuracy (a metric that is accuracy again, or uses the wrong labels, fails).
    assert 0.6 < balanced["hgb"] < acc["hgb"] - 0.2
    assert auc["hgb"] > 0.75
    assert report["reference"] is None


def test_auc_is_null_with_a_reason_when_a_class_is_missing(tmp_path: Path) -> None:
    X_raw, y = _imbalanced(300, 0)
    meta = _metadata([0, 1, 2])
    X = unit_features(X_raw, np.zeros(D), np.full(D, 10.0))
    release = Release(X, one_hot(y, 3), meta)  # class 2: no training row
    X_test, y_test = _imbalanced(200, 1)
    y_test[:10] = 2
    report = evaluate(release, X_test, y_test, classifiers=("logistic", "linear"))
    assert report["roc_auc"]["logistic"] is None
    assert "absent from the release" in report["roc_auc_reason"]["logistic"]
    assert 0 <= report["balanced_accuracy"]["logistic"] <= 1
    # A family with scores for every class (ridge) still has a macro one-vs-rest AUC.
    assert 0 <= report["roc_auc"]["linear"] <= 1


def test_multiclass_auc_is_macro_one_vs_rest() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    yt = rng.integers(0, 3, size=200)
    scores = rng.random((200, 3)) + 0.5 * np.eye(3)[yt]
    probabilities = scores / scores.sum(1, keepdims=True)
    expected = roc_auc_score(yt, probabilities, multi_class="ovr", average="macro")
    assert evaluation.roc_auc(yt, probabilities) == pytest.approx(expected)


def test_the_reference_is_the_same_models_on_real_records(tmp_path: Path) -> None:
    X_raw, y = _imbalanced(600, 0)
    release = _write_release(tmp_path / "r.npz", "npz", X_raw, y)
    noisy = Release(release.X, np.random.default_rng(3).permutation(release.Y), release.metadata)
    X_test, y_test = _imbalanced(1000, 1)
    report = evaluate(noisy, X_test, y_test, classifiers=("logistic",), reference=(X_raw, y))
    assert report["reference"]["rows"] == 600
    # Real labels teach what the shuffled release cannot.
    assert report["reference"]["logistic"]["roc_auc"] > 0.8
    assert report["roc_auc"]["logistic"] < 0.7


def _cli(args: list[str]) -> Any:
    return CliRunner().invoke(cli, ["evaluate", *args])


def test_cli_reads_a_csv_release_and_prints_a_line_per_classifier_as_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    X_raw, y = _imbalanced(400, 0)
    release = _write_release(tmp_path / "r.csv", "csv", X_raw, y)
    (tmp_path / "meta.json").write_text(json.dumps(release.metadata))
    X_test, y_test = _imbalanced(300, 1)
    _write_table(tmp_path / "test.csv", X_test, y_test)
    events: list[str] = []

    def traced(kind: str) -> evaluation.Trainer:
        train = evaluation.FAMILIES[kind]

        def run(data: evaluation.TrainingSet) -> evaluation.Prediction:
            events.append(f"start {kind}")
            return train(data)

        return run

    line = evaluate_cmd._line
    monkeypatch.setattr(
        evaluate_cmd, "_line", lambda n, r: events.append(f"line {n}") or line(n, r)
    )
    for kind in ("logistic", "hgb", "sklearn_mlp"):
        monkeypatch.setitem(evaluation.FAMILIES, kind, traced(kind))
    args = [str(tmp_path / "r.csv"), "--test", str(tmp_path / "test.csv")]
    result = _cli([*args, "--metadata", str(tmp_path / "meta.json")])
    assert result.exit_code == 0, result.output
    # Each result is printed before the next model starts training.
    assert events == [
        "line majority",
        "start logistic",
        "line logistic",
        "start hgb",
        "line hgb",
        "start sklearn_mlp",
        "line sklearn_mlp",
    ]
    lines = [ln for ln in result.stderr.splitlines() if "balanced" in ln]
    assert [ln.split()[0] for ln in lines] == ["majority", "logistic", "hgb", "sklearn_mlp"]
    assert "no --reference file" in result.stderr
    report = json.loads(result.stdout)
    assert set(report["accuracy"]) == {"logistic", "hgb", "sklearn_mlp"}
    assert set(report["balanced_accuracy"]) == set(report["roc_auc"]) == set(report["seconds"])
    assert report["majority"]["balanced_accuracy"] == 0.5
    assert report["test_preprocessing"] == "declared feature range"


@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_cli_every_release_format_with_a_reference(tmp_path: Path, fmt: str) -> None:
    X_raw, y = _imbalanced(400, 0)
    written = _write_release(tmp_path / f"r.{fmt}", fmt, X_raw, y)
    X_test, y_test = _imbalanced(300, 1)
    np.savez(tmp_path / "ref.npz", X=X_raw, y=y)
    _write_table(tmp_path / "test.parquet", X_test, y_test, label="y")
    args = [str(tmp_path / f"r.{fmt}"), "--test", str(tmp_path / "test.parquet")]
    if fmt == "csv":  # the metadata.json artifact beside a CSV release
        (tmp_path / "meta.json").write_text(json.dumps(written.metadata))
        args += ["--metadata", str(tmp_path / "meta.json")]
    result = _cli([*args, "--reference", str(tmp_path / "ref.npz"), "--classifier", "logistic"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["roc_auc"]["logistic"] > 0.75
    assert report["reference"]["logistic"]["roc_auc"] > 0.75
    assert "reference/logistic" in result.stderr


def test_cli_refuses_the_cnn_on_tabular_data_and_mismatched_features(tmp_path: Path) -> None:
    X_raw, y = _imbalanced(200, 0)
    _write_release(tmp_path / "r.parquet", "parquet", X_raw, y)
    np.savez(tmp_path / "test.npz", X=X_raw, y=y)
    np.savez(tmp_path / "narrow.npz", X=X_raw[:, :3], y=y)
    release, test = str(tmp_path / "r.parquet"), str(tmp_path / "test.npz")
    result = _cli([release, "--test", test, "--classifier", "cnn"])
    assert result.exit_code == 1 and "cnn needs image-shaped data" in result.stderr
    result = _cli([release, "--test", str(tmp_path / "narrow.npz")])
    assert result.exit_code == 1
    assert "test records have 3 features, the release's data 5" in result.stderr
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    result = _cli([str(tmp_path / "junk.npz"), "--test", test])
    assert result.exit_code == 1 and "cannot read" in result.stderr
