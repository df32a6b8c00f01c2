"""The figures a trained family is scored by on the real test rows, and the release's own
fidelity to them."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcore.evaluation.models import Prediction


def roc_auc(yt: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of per-class scores: binary (two classes), the positive class's score against
    the negative's; more classes, the macro mean of one-vs-rest AUCs over the classes the test
    set holds (sklearn's ``multi_class="ovr"``, for decision values as well as
    probabilities)."""
    from sklearn.metrics import roc_auc_score

    if scores.shape[1] == 2:
        return float(roc_auc_score(yt == 1, scores[:, 1] - scores[:, 0]))
    present = np.unique(yt)
    return float(np.mean([roc_auc_score(yt == c, scores[:, c]) for c in present]))


def balanced_accuracy(yt: np.ndarray, pred: np.ndarray) -> float:
    """The mean recall over the classes the test set holds."""
    return float(np.mean([np.mean(pred[yt == c] == c) for c in np.unique(yt)]))


def metrics(yt: np.ndarray, prediction: Prediction) -> dict[str, Any]:
    """Accuracy, balanced accuracy and ROC AUC (null with ``roc_auc_reason`` when it cannot be
    computed: no scores, or a test set of one class)."""
    row: dict[str, Any] = {
        "accuracy": float(np.mean(prediction.labels == yt)),
        "balanced_accuracy": balanced_accuracy(yt, prediction.labels),
        "roc_auc": None,
    }
    if len(np.unique(yt)) < 2:
        row["roc_auc_reason"] = "the test set holds one class"
    elif prediction.scores is None:
        row["roc_auc_reason"] = prediction.no_scores or "the model gives no scores"
    else:
        row["roc_auc"] = roc_auc(yt, prediction.scores)
    return row


def majority_class(Y: np.ndarray) -> int:
    """The release's most frequent class: the largest total of its (clipped) label columns."""
    return int(np.clip(Y, 0, None).sum(axis=0).argmax())


def fidelity(X: np.ndarray, Y: np.ndarray, Xt: np.ndarray, yt: np.ndarray) -> dict[str, float]:
    """Simple distances between the release and the real test data (both preprocessed)."""
    real_labels = np.bincount(yt, minlength=Y.shape[1]) / len(yt)
    release_labels = np.clip(Y, 0, None).sum(axis=0)
    release_labels = release_labels / max(release_labels.sum(), 1e-12)
    return {
        "feature_mean_l2": float(np.linalg.norm(X.mean(axis=0) - Xt.mean(axis=0))),
        "feature_std_ratio": float(X.std() / max(Xt.std(), 1e-12)),
        "label_tv_distance": float(0.5 * np.abs(release_labels - real_labels).sum()),
        "release_row_norm_mean": float(np.linalg.norm(X, axis=1).mean()),
        "test_row_norm_mean": float(np.linalg.norm(Xt, axis=1).mean()),
    }
