"""Utility of a release: classifiers trained on it and tested on real data, fidelity figures.

Everything here is post-processing of a release plus the analyst's own test data: it costs no
privacy. Test records are preprocessed exactly as the release's metadata says (declared bounds,
declared statistics, the published projection), so train and test live in the same space.
"""

from __future__ import annotations

import io
import json
import math
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore import release_layout
from dpcore.categorical import encode_declared
from dpcore.mechanisms.spec import EvaluationHints, soft_labels
from dpcore.preprocessing import RowTransform, unit_features

if TYPE_CHECKING:
    import torch

# Analyst-side extras on top of what the release already is (its own `postprocess` ran in the
# worker): a Gaussian blur of image rows, or projection on the release's top 50 components.
POSTPROCESSING = ("none", "blur", "pca")


@dataclass
class Release:
    X: np.ndarray
    Y: np.ndarray
    metadata: dict[str, Any]
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def hints(self) -> EvaluationHints:
        return hints_for(self.metadata["mechanism"])

    @property
    def soft_labels(self) -> bool:
        """Train on the labels as class distributions (else regress them): from the label
        kind the release's layout states, else its mechanism's (a release made before
        layouts), else soft (a mechanism this installation does not know)."""
        layout = release_layout.read_layout(self.metadata)
        if layout is not None:
            return soft_labels(layout.kind)
        from dpcore.mechanisms import registry

        try:
            return registry.get(self.metadata["mechanism"]).soft_labels
        except ValueError:
            return True

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """(h, w) when the release's rows are images: its metadata's 2-D feature shape, or,
        for a file without that metadata (a CSV release), d a perfect square ≥ 64 (28 × 28)."""
        if not self.hints.image_features:
            return None
        if "feature_shape" in self.metadata:
            shape = tuple(self.metadata["feature_shape"])
            return shape if len(shape) == 2 else None
        side = math.isqrt(self.X.shape[1])
        return (side, side) if side * side == self.X.shape[1] and side >= 8 else None


def hints_for(mechanism: str) -> EvaluationHints:
    """The mechanism's evaluation hints (defaults for one this installation does not know:
    unit-scale features, soft labels)."""
    from dpcore.mechanisms import registry

    try:
        return registry.get(mechanism).evaluation
    except ValueError:
        return EvaluationHints()


def load_release(content: bytes) -> Release:
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(str(arrays.pop("metadata")))
    X, Y = arrays.pop("X"), arrays.pop("y")
    return Release(X.astype(np.float64), Y.astype(np.float64), metadata, arrays)


#: Label names an analyst's test table is most likely to use, tried in order when no
#: ``label_column`` is given (a release's own label column is in its metadata's layout).
LABEL_COLUMNS = ("y", "label", "class", "target")


def detect_format(path: Any) -> str:
    """npz, parquet or csv, from the file's first bytes (an NPZ is a zip, a Parquet file starts
    with PAR1), so a misnamed file is still read as what it is."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] == b"PK":
        return "npz"
    if head == b"PAR1":
        return "parquet"
    return "csv"


def _read_table(path: Any, fmt: str, text_column: str | None = None) -> Any:
    """The table in ``path``; ``text_column`` (CSV) is read as text, not typed by its look."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            return pq.read_table(path)
        types = {text_column: pa.string()} if text_column is not None else None
        return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=types))
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise ValueError(f"cannot read {path} as {fmt}: {exc}") from None


def load_release_file(path: Any, metadata: dict[str, Any] | None = None) -> Release:
    """A release file as the service writes it (worker/artifacts.py), whatever its format.

    NPZ and Parquet carry their metadata (the NPZ's ``metadata`` array, the Parquet schema's
    ``dprelease`` key); a CSV release carries none: pass ``metadata`` (the release's
    ``metadata.json`` artifact), which also overrides what a file carries. The metadata's
    ``layout`` names the columns (``dpcore.release_layout``). A release made before layouts
    (columns ``x_<feature>``, ``y_<class>``) still reads, without metadata too: classes from
    the ``y_<class>`` columns, no feature range (test rows are then used as given)."""
    fmt = detect_format(path)
    if fmt == "npz":
        try:
            with open(path, "rb") as handle:
                release = load_release(handle.read())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(
                f"cannot read {path} as an NPZ release (X, y, metadata): {exc}"
            ) from None
        if metadata is not None:
            release.metadata = metadata
        return release
    if metadata is None and fmt == "parquet":
        stored = _read_schema(path).metadata or {}
        if b"dprelease" in stored:
            metadata = json.loads(stored[b"dprelease"])
    table = _read_table(path, fmt, _text_label(metadata) if fmt == "csv" else None)
    return _table_release(table, path, metadata, {})


def _read_schema(path: Any) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise ValueError(f"cannot read {path} as parquet: {exc}") from None


def _text_label(metadata: Mapping[str, Any] | None) -> str | None:
    """The exact label column of a release's layout, to read from CSV as text: the classes
    are matched by their text (a class "001" must not be read as the number 1)."""
    layout = release_layout.read_layout(metadata) if metadata is not None else None
    return layout.label if layout is not None and layout.kind == "exact" else None


def _table_release(
    table: Any, path: Any, metadata: dict[str, Any] | None, extra: dict[str, np.ndarray]
) -> Release:
    """X and the label matrix Y of a CSV or Parquet release table, by its layout (an exact
    label column becomes one-hot rows), or by the ``x_``/``y_`` names of an older release."""
    names = table.column_names
    layout = release_layout.read_layout(metadata) if metadata is not None else None
    if layout is None:
        return _legacy_table_release(table, path, metadata, extra)
    missing = [c for c in layout.columns if c not in names]
    if missing:
        raise ValueError(
            f"{path} does not match its metadata's layout: no column(s) {missing[:5]} "
            f"(found {names[:10]})"
        )
    X = _stack(table, layout.features)
    if layout.kind == "exact":
        try:
            Y = release_layout.one_hot(layout, table.column(layout.label).to_pylist())
        except release_layout.LayoutError as exc:
            raise ValueError(f"{path}: {exc}") from None
    else:
        Y = _stack(table, layout.label_columns)
    assert metadata is not None
    return Release(X, Y, metadata, extra)


def _stack(table: Any, columns: Sequence[str]) -> np.ndarray:
    if not columns:
        return np.zeros((table.num_rows, 0))
    return np.column_stack([table.column(c).to_numpy() for c in columns]).astype(np.float64)


def _legacy_table_release(
    table: Any, path: Any, metadata: dict[str, Any] | None, extra: dict[str, np.ndarray]
) -> Release:
    """A release made before layouts: ``x_<feature>`` then ``y_<class>`` columns."""
    x_cols = [c for c in table.column_names if c.startswith("x_")]
    y_cols = [c for c in table.column_names if c.startswith("y_")]
    if not x_cols or not y_cols:
        raise ValueError(
            f"{path} is a release table whose columns are named in its metadata's layout; "
            "give the release's metadata (dprelease evaluate --metadata metadata.json: the "
            "release's metadata.json artifact, or a Parquet release's own) — found columns "
            f"{table.column_names[:10]} and no layout"
        )
    if metadata is None:
        metadata = {
            "mechanism": "unknown",
            "params": {},
            "classes": [c[2:] for c in y_cols],
            "feature_names": [c[2:] for c in x_cols],
        }
    X, Y = _stack(table, x_cols), _stack(table, y_cols)
    if len(metadata.get("classes", y_cols)) != len(y_cols):
        raise ValueError(
            f"{path} has {len(y_cols)} label columns, "
            f"its metadata {len(metadata['classes'])} classes"
        )
    return Release(X, Y, metadata, extra)


def load_records(
    path: Any,
    *,
    label_column: str | None = None,
    feature_names: list[str] | None = None,
    declared: list[dict[str, Any]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Real records (features ``X`` in the dataset's raw scale, labels ``y``) from an NPZ with
    ``X`` and ``y`` or a CSV/Parquet table with a label column: ``label_column``, else the
    first of LABEL_COLUMNS present. The table's other columns are the features, taken in the
    release's feature order when it names them all (``feature_names``), else in file order.

    ``declared``: the release's declared columns (its metadata's ``declared_columns``). A table
    holding those columns as uploaded (categories as text, gaps) is encoded the way the upload
    was — one-hot categories, each column's missing-value policy — so the real table itself can
    be the test file."""
    fmt = detect_format(path)
    if fmt == "npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                X, y = npz["X"], npz["y"]
        except KeyError as exc:
            raise ValueError(
                f"{path}: an NPZ of records needs arrays X and y (missing {exc})"
            ) from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"cannot read {path} as NPZ: {exc}") from None
        return np.asarray(X).reshape(len(X), -1), np.asarray(y)
    table = _read_table(path, fmt)
    names = table.column_names
    if label_column is None:
        label_column = next((c for c in LABEL_COLUMNS if c in names), None)
        if label_column is None:
            raise ValueError(
                f"{path}: no label column among {list(LABEL_COLUMNS)}; name it with --label-column"
            )
    elif label_column not in names:
        raise ValueError(f"{path} has no column {label_column!r}")
    if declared and {c["name"] for c in declared} == set(names) - {label_column}:
        return _declared_records(path, fmt, label_column, declared)
    rest = [c for c in names if c != label_column]
    if feature_names and all(f in rest for f in feature_names):
        rest = list(feature_names)
    try:
        X = np.column_stack([table.column(c).to_numpy() for c in rest]).astype(np.float64)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: feature columns must be numeric ({exc})") from None
    y = np.asarray(table.column(label_column).to_pylist(), dtype=object)
    return X, y


def _declared_records(
    path: Any, fmt: str, label_column: str, declared: list[dict[str, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """A table in the declared schema encoded as its upload was (``load_records``). A CSV is
    read as the service reads one: categorical columns as text, only an empty cell missing."""
    import pandas as pd

    if fmt == "csv":
        text = {c["name"]: str for c in declared if c["type"] == "categorical"}
        frame = pd.read_csv(
            path, dtype={**text, label_column: str}, keep_default_na=False, na_values=[""]
        )
    else:
        frame = pd.read_parquet(path)
    try:
        X = encode_declared(frame, declared)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return X, frame[label_column].to_numpy(dtype=object)


def release_from_file(
    path: Any, fmt: str, metadata: dict[str, Any], extra: dict[str, np.ndarray]
) -> Release:
    """A release read back from its artifact file (NPZ, CSV or Parquet) with its metadata."""
    if fmt == "npz":
        with open(path, "rb") as handle:
            return load_release(handle.read())
    table = _read_table(path, fmt, _text_label(metadata) if fmt == "csv" else None)
    return _table_release(table, path, metadata, extra)


def preprocess_test(release: Release, X_raw: np.ndarray) -> np.ndarray:
    """Map real records into the release's feature space, with public facts only."""
    meta = release.metadata
    X = np.asarray(X_raw, dtype=np.float64).reshape(len(X_raw), -1)
    if "feature_range" in meta:
        expected = len(meta["feature_range"]["lo"])
    elif "feature_names" in meta:
        expected = len(meta["feature_names"])
    else:
        expected = release.X.shape[1]
    if X.shape[1] != expected:
        raise ValueError(
            f"the test records have {X.shape[1]} features, the release's data {expected}"
        )
    transform = meta.get("transform")
    if transform is not None and transform.get("output", "raw") != "mechanism":
        # Released in the data's units: a real record as the release
        # represents it — clipped to the declared bounds and to the row-norm bound, nothing
        # else (records inside both are used as they are).
        return RowTransform.from_metadata(transform).real_rows(X)
    custom = release.hints.preprocess_test
    if custom is not None:
        # Releases outside the data's feature space (projections), and releases made before
        # the transform was recorded.
        return np.asarray(custom(meta, release.extra, X))
    if "feature_range" not in meta:
        # A release without its metadata (a CSV release): no declared bounds to map test rows
        # with, so they are taken as already in the release's feature space.
        return X
    lo = np.asarray(meta["feature_range"]["lo"])
    hi = np.asarray(meta["feature_range"]["hi"])
    return unit_features(X, lo, hi)


def model_scale(meta: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """What every model here is fed: a release in raw units (and the test rows beside it)
    scaled per feature by the declared bounds, (x − lo)/(hi − lo) — (x)/(hi − lo) for centred
    combinations — as any analyst's pipeline would scale columns of very different ranges. A
    public, affine map: the same for train and test rows. Releases in the mechanism's own
    scale (projections, releases from before the transform) are fed as they are."""
    transform = meta.get("transform")
    if transform is None or transform.get("output", "raw") == "mechanism":
        return lambda X: X
    lo = np.asarray(transform["lo"], dtype=np.float64)
    width = np.asarray(transform["hi"], dtype=np.float64) - lo
    if transform.get("output") == "centred":
        return lambda X: np.asarray(X, dtype=np.float64) / width
    return lambda X: (np.asarray(X, dtype=np.float64) - lo) / width


def class_indices(release: Release, y_raw: np.ndarray) -> np.ndarray:
    classes = [str(c) for c in release.metadata["classes"]]
    lookup = {c: i for i, c in enumerate(classes)}
    try:
        return np.array([lookup[str(v.item() if hasattr(v, "item") else v)] for v in y_raw])
    except KeyError as exc:
        raise ValueError(f"test label {exc} is not among the release's classes") from None


def postprocess(release: Release, how: str) -> np.ndarray:
    """Free post-processing of the release's features (the stored release is never changed)."""
    X = release.X
    if how == "none":
        return X
    if how == "blur":
        shape = release.image_shape
        if shape is None:
            raise ValueError("blur applies to image-shaped releases")
        from scipy import ndimage

        images = X.reshape(len(X), *shape)
        return ndimage.gaussian_filter(images, sigma=(0, 1, 1)).reshape(len(X), -1)
    if how == "pca":
        centred = X - X.mean(axis=0)
        _, _, vt = np.linalg.svd(centred[: min(len(X), 20000)], full_matrices=False)
        k = min(50, vt.shape[0])
        return X.mean(axis=0) + centred @ vt[:k].T @ vt[:k]
    raise ValueError(f"unknown post-processing {how!r}")


def _soft_targets(Y: np.ndarray) -> torch.Tensor:
    import torch

    # Noisy mixed labels → a distribution over classes (post-processing).
    t = torch.tensor(np.clip(Y, 0, None), dtype=torch.float32)
    return t / t.sum(1, keepdim=True).clamp(min=1e-6)


@dataclass(frozen=True)
class TrainingSet:
    """What every model family gets: release features ``X`` and label matrix ``Y`` (soft class
    mixtures or signed combinations, per ``soft``), the preprocessed real test rows ``Xt``,
    the image shape (None: not image-shaped) and the torch families' epochs and seed."""

    X: np.ndarray
    Y: np.ndarray
    Xt: np.ndarray
    shape: tuple[int, ...] | None
    soft: bool
    epochs: int
    seed: int

    def hard_labels(self) -> np.ndarray:
        # An analyst's off-the-shelf classifier needs one class per row: the label vector's
        # largest entry. A row whose entries are all ≤ 0 carries no usable class, but dropping
        # rows would be a data-dependent choice the release did not make; argmax keeps them.
        return self.Y.argmax(axis=1)


@dataclass(frozen=True)
class Prediction:
    """A trained family's output on the test rows: its predicted class indices and, for ROC
    AUC, per-class scores (n × k, over every release class; probabilities or decision values,
    only their order matters) or None with the reason there are none."""

    labels: np.ndarray
    scores: np.ndarray | None
    no_scores: str | None = None


#: A model family: trained on the release, returns its Prediction on ``Xt``.
Trainer = Callable[[TrainingSet], Prediction]


def _linear(data: TrainingSet) -> Prediction:
    """Ridge regression (λ = 1) on the label matrix itself: signed or soft labels as given."""
    A = np.hstack([data.X, np.ones((len(data.X), 1))])
    W = np.linalg.solve(A.T @ A + np.eye(A.shape[1]), A.T @ data.Y)
    scores = np.hstack([data.Xt, np.ones((len(data.Xt), 1))]) @ W
    return Prediction(scores.argmax(1), scores)


def weighted_rows(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Soft labels as scikit-learn takes them: every row once per class, weighted by the row's
    share of that class (its non-negative entries scaled to sum to 1) — None when every row
    is one-hot already (hard labels say the same) or carries nothing positive. A release of
    class mixtures with a rare class (a 5 % outcome mixed 16 records at a time) has that class
    as almost no row's argmax; weighted, each mixture still says how much of it it holds."""
    Y = np.clip(np.asarray(Y, dtype=np.float64), 0.0, None)
    if len(Y) == 0 or bool(np.isin(Y, (0.0, 1.0)).all() and (Y.sum(axis=1) == 1).all()):
        return None
    total = Y.sum(axis=1, keepdims=True)
    weights = np.divide(Y, total, out=np.zeros_like(Y), where=total > 0)
    if int((weights > 0).any(axis=0).sum()) < 2:  # one class at most: hard labels say it
        return None
    k = Y.shape[1]
    rows = np.repeat(np.arange(len(X)), k)
    classes = np.tile(np.arange(k), len(X))
    w = weights.reshape(-1)
    keep = w > 0
    return X[rows[keep]], classes[keep], w[keep]


def _sklearn(make: Callable[[int], Any]) -> Trainer:
    """A scikit-learn classifier with its default settings: on soft labels (class mixtures)
    through per-class weighted rows (``weighted_rows``), else on hard labels (argmax of Y)."""

    def train(data: TrainingSet) -> Prediction:
        weighted = weighted_rows(data.X, data.Y) if data.soft else None
        y = data.hard_labels() if weighted is None else weighted[1]
        present = np.unique(y)
        if len(present) < 2:
            # scikit-learn refuses one-class training sets; the only thing such a release can
            # teach is that class, so predict it (accuracy = its share of the test set).
            return Prediction(
                np.full(len(data.Xt), present[0]),
                None,
                f"the release's labels hold one class ({int(present[0])})",
            )
        model = make(data.seed)
        if weighted is None:
            model.fit(data.X, y)
        else:
            model.fit(weighted[0], y, sample_weight=weighted[2])
        labels = np.asarray(model.predict(data.Xt))
        k = data.Y.shape[1]
        if len(present) < k:
            # A class no training row carries has no score a ranking could use.
            missing = sorted(set(range(k)) - {int(c) for c in present})
            return Prediction(
                labels, None, f"classes {missing} absent from the release's hard labels"
            )
        if hasattr(model, "predict_proba"):
            raw = np.asarray(model.predict_proba(data.Xt))
        else:
            raw = np.asarray(model.decision_function(data.Xt))
            if raw.ndim == 1:  # binary: the positive class's margin
                raw = np.column_stack([-raw, raw])
        scores = np.zeros((len(data.Xt), k))
        scores[:, np.asarray(model.classes_, dtype=int)] = raw
        return Prediction(labels, scores)

    return train


def _logistic(seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(random_state=seed)


def _sklearn_mlp(seed: int) -> Any:
    from sklearn.neural_network import MLPClassifier

    return MLPClassifier(random_state=seed)


def _hgb(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(random_state=seed)


def _torch_family(kind: str) -> Trainer:
    def train(data: TrainingSet) -> Prediction:
        if kind == "cnn" and data.shape is None:
            raise ValueError(NOT_IMAGES)
        return _train(kind, data)

    return train


NOT_IMAGES = (
    "cnn needs image-shaped data (a 2-D feature shape, or d a perfect square ≥ 64 such as 784); "
    "this release is tabular: use logistic, hgb or sklearn_mlp"
)

#: Every model family ``evaluate`` can train, by name: the one table the CLI, the worker's
#: owner report and the benches read.
FAMILIES: dict[str, Trainer] = {
    "linear": _linear,
    "logistic": _sklearn(_logistic),
    "sklearn_mlp": _sklearn(_sklearn_mlp),
    "hgb": _sklearn(_hgb),
    "mlp": _torch_family("mlp"),
    "cnn": _torch_family("cnn"),
}
CLASSIFIERS = tuple(FAMILIES)
#: The scikit-learn families' unfitted models by name (``make(seed)``), with the settings
#: ``evaluate`` trains: a study that needs the fitted model's class probabilities (bench/
#: tabular.py) builds the same models from here.
SKLEARN_MODELS: dict[str, Callable[[int], Any]] = {
    "logistic": _logistic,
    "sklearn_mlp": _sklearn_mlp,
    "hgb": _hgb,
}
#: What ``dprelease evaluate`` trains unless told: scikit-learn models as an analyst would use
#: them, quick on CPU; the torch networks only when asked.
DEFAULT_CLASSIFIERS = ("logistic", "hgb", "sklearn_mlp")


def families_for(release: Release, requested: tuple[str, ...]) -> tuple[str, ...]:
    """The families to train: ``all`` is every family that applies (the CNN on images only);
    the CNN asked for by name on tabular data is refused."""
    if "all" in requested:
        return tuple(f for f in CLASSIFIERS if f != "cnn" or release.image_shape is not None)
    if "cnn" in requested and release.image_shape is None:
        raise ValueError(NOT_IMAGES)
    return requested or DEFAULT_CLASSIFIERS


def _network(kind: str, dim: int, k: int, shape: tuple[int, ...] | None) -> torch.nn.Module:
    import torch

    if kind == "mlp":
        return torch.nn.Sequential(
            torch.nn.Linear(dim, 256), torch.nn.ReLU(), torch.nn.Linear(256, k)
        )
    assert shape is not None
    h, w = shape
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, h, w)),
        torch.nn.Conv2d(1, 16, 5, padding=2),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * (h // 4) * (w // 4), 100),
        torch.nn.ReLU(),
        torch.nn.Linear(100, k),
    )


def _train(kind: str, data: TrainingSet) -> Prediction:
    import torch

    torch.manual_seed(data.seed)
    net = _network(kind, data.X.shape[1], data.Y.shape[1], data.shape)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    xs = torch.tensor(data.X, dtype=torch.float32)
    soft = data.soft
    targets = _soft_targets(data.Y) if soft else torch.tensor(data.Y, dtype=torch.float32)
    for _ in range(data.epochs):
        order = torch.randperm(len(xs))
        for start in range(0, len(xs), 64):
            batch = order[start : start + 64]
            out = net(xs[batch])
            if soft:
                loss = -(targets[batch] * torch.log_softmax(out, 1)).sum(1).mean()
            else:  # signed combinations of labels: regress the label vector
                loss = torch.nn.functional.mse_loss(out, targets[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        scores = net(torch.tensor(data.Xt, dtype=torch.float32)).numpy().astype(np.float64)
    return Prediction(scores.argmax(1), scores)


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
