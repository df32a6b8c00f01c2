"""``evaluate``: every requested family trained on a release and scored on real test rows,
beside the majority-class row and, optionally, the same families trained on real records."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpcore.evaluation.models import CLASSIFIERS, FAMILIES, NOT_IMAGES, Prediction, TrainingSet
from dpcore.evaluation.records import class_indices, model_scale, postprocess, preprocess_test
from dpcore.evaluation.release import Release
from dpcore.evaluation.scores import fidelity, majority_class, metrics

#: Called as each model finishes: its name ("logistic", "majority", "reference/logistic") and
#: its metrics row (with "seconds").
OnResult = Callable[[str, dict[str, Any]], None]


def evaluate(
    release: Release,
    X_test_raw: np.ndarray,
    y_test_raw: np.ndarray,
    *,
    classifiers: tuple[str, ...] = ("linear", "mlp"),
    postprocessing: str = "none",
    epochs: int = 20,
    seed: int = 0,
    reference: tuple[np.ndarray, np.ndarray] | None = None,
    on_result: OnResult | None = None,
) -> dict[str, Any]:
    """Train each family on the release and score it on the test records. Beside them: the
    majority-class row (the release's most frequent class, predicted for every test row: what
    the release's label counts alone give, learned without the test set) and, when
    ``reference`` holds real training records (X raw, y), the same families trained on them:
    what the data would give without privacy."""
    for kind in classifiers:
        if kind not in FAMILIES:
            raise ValueError(f"unknown model family {kind!r}; known: {CLASSIFIERS}")
    if "cnn" in classifiers and release.image_shape is None:
        raise ValueError(NOT_IMAGES)  # before anything is trained, not after the others
    scaled = model_scale(release.metadata)
    Xt = scaled(preprocess_test(release, X_test_raw))
    yt = class_indices(release, y_test_raw)
    X = scaled(postprocess(release, postprocessing))
    soft = release.soft_labels
    k = release.Y.shape[1]
    report: dict[str, Any] = {
        "release_id": release.metadata.get("release_id"),
        "mechanism": release.metadata["mechanism"],
        "params": release.metadata["params"],
        "charge": release.metadata.get("charge"),
        "postprocessing": postprocessing,
        "test_preprocessing": "declared feature range"
        if "feature_range" in release.metadata or release.hints.preprocess_test
        else "none: the release file carries no metadata, test rows are used as given",
        "rows": len(X),
        "test_rows": len(yt),
        "chance": float(np.bincount(yt).max() / len(yt)),
        "accuracy": {},
        "balanced_accuracy": {},
        "roc_auc": {},
        "roc_auc_reason": {},
        "seconds": {},
        "fidelity": fidelity(X, release.Y, Xt, yt),
    }

    def record(name: str, row: dict[str, Any]) -> None:
        if on_result is not None:
            on_result(name, row)

    top = majority_class(release.Y)
    majority = metrics(yt, Prediction(np.full(len(yt), top), np.tile(np.eye(k)[top], (len(yt), 1))))
    report["majority"] = {"class": release.metadata["classes"][top], **majority}
    record("majority", report["majority"])

    data = TrainingSet(X, release.Y, Xt, release.image_shape, soft=soft, epochs=epochs, seed=seed)
    for kind in classifiers:
        start = time.perf_counter()
        row = metrics(yt, FAMILIES[kind](data))
        row["seconds"] = round(time.perf_counter() - start, 3)
        for key in ("accuracy", "balanced_accuracy", "roc_auc", "seconds"):
            report[key][kind] = row[key]
        if "roc_auc_reason" in row:
            report["roc_auc_reason"][kind] = row["roc_auc_reason"]
        record(kind, row)

    if reference is None:
        report["reference"] = None
        return report
    # The non-private reference: real records, preprocessed as the test rows, one-hot labels.
    Xr = scaled(preprocess_test(release, reference[0]))
    Yr = np.eye(k)[class_indices(release, reference[1])]
    ref = TrainingSet(Xr, Yr, Xt, release.image_shape, soft=True, epochs=epochs, seed=seed)
    report["reference"] = {"rows": len(Xr)}
    for kind in classifiers:
        start = time.perf_counter()
        row = metrics(yt, FAMILIES[kind](ref))
        row["seconds"] = round(time.perf_counter() - start, 3)
        report["reference"][kind] = row
        record(f"reference/{kind}", row)
    return report
