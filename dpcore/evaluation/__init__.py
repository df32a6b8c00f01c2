"""Utility of a release: classifiers trained on it and tested on real data, fidelity figures.

Everything here is post-processing of a release plus the analyst's own test data: it costs no
privacy. Test records are preprocessed exactly as the release's metadata says (declared bounds,
declared statistics, the published projection), so train and test live in the same space.

``release`` reads a release back, ``records`` reads and maps the real records, ``models`` holds
the model families, ``scores`` the metrics, and ``report`` runs ``evaluate``.
"""

from dpcore.evaluation.models import (
    CLASSIFIERS,
    DEFAULT_CLASSIFIERS,
    FAMILIES,
    NOT_IMAGES,
    SKLEARN_MODELS,
    Prediction,
    Trainer,
    TrainingSet,
    families_for,
    weighted_rows,
)
from dpcore.evaluation.records import (
    LABEL_COLUMNS,
    POSTPROCESSING,
    class_indices,
    load_records,
    model_scale,
    postprocess,
    preprocess_test,
)
from dpcore.evaluation.release import (
    Release,
    detect_format,
    hints_for,
    load_release,
    load_release_file,
    release_from_file,
)
from dpcore.evaluation.report import OnResult, evaluate
from dpcore.evaluation.scores import balanced_accuracy, fidelity, majority_class, metrics, roc_auc

__all__ = [
    "CLASSIFIERS",
    "DEFAULT_CLASSIFIERS",
    "FAMILIES",
    "LABEL_COLUMNS",
    "NOT_IMAGES",
    "POSTPROCESSING",
    "SKLEARN_MODELS",
    "OnResult",
    "Prediction",
    "Release",
    "Trainer",
    "TrainingSet",
    "balanced_accuracy",
    "class_indices",
    "detect_format",
    "evaluate",
    "families_for",
    "fidelity",
    "hints_for",
    "load_records",
    "load_release",
    "load_release_file",
    "majority_class",
    "metrics",
    "model_scale",
    "postprocess",
    "preprocess_test",
    "release_from_file",
    "roc_auc",
    "weighted_rows",
]
