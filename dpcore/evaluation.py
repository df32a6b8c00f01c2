"""Utility of a release: classifiers trained on it and tested on real data, fidelity figures.

Everything here is post-processing of a release plus the analyst's own test data: it costs no
privacy. Test records are preprocessed exactly as the release's metadata says (declared bounds,
declared statistics, the published projection), so train and test live in the same space.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore.mechanisms.spec import EvaluationHints
from dpcore.preprocessing import unit_features

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
    def image_shape(self) -> tuple[int, ...] | None:
        shape = tuple(self.metadata.get("feature_shape", ()))
        if len(shape) == 2 and self.hints.image_features:
            return shape
        return None


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


def release_from_file(
    path: Any, fmt: str, metadata: dict[str, Any], extra: dict[str, np.ndarray]
) -> Release:
    """A release read back from its artifact file (NPZ, CSV or Parquet)."""
    if fmt == "npz":
        with open(path, "rb") as handle:
            return load_release(handle.read())
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pq.read_table(path) if fmt == "parquet" else pacsv.read_csv(path)
    x_cols = [c for c in table.column_names if c.startswith("x_")]
    y_cols = [c for c in table.column_names if c.startswith("y_")]
    X = np.column_stack([table.column(c).to_numpy() for c in x_cols]).astype(np.float64)
    Y = np.column_stack([table.column(c).to_numpy() for c in y_cols]).astype(np.float64)
    return Release(X, Y, metadata, extra)


def preprocess_test(release: Release, X_raw: np.ndarray) -> np.ndarray:
    """Map real records into the release's feature space, with public facts only."""
    meta = release.metadata
    X = np.asarray(X_raw, dtype=np.float64).reshape(len(X_raw), -1)
    custom = release.hints.preprocess_test
    if custom is not None:
        return np.asarray(custom(meta, release.extra, X))
    lo = np.asarray(meta["feature_range"]["lo"])
    hi = np.asarray(meta["feature_range"]["hi"])
    return unit_features(X, lo, hi)


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


#: A model family: trained on the release, returns its predicted class indices on ``Xt``, or
#: None when the family does not apply (the CNN on data that is not image-shaped).
Trainer = Callable[[TrainingSet], np.ndarray | None]


def _linear(data: TrainingSet) -> np.ndarray:
    """Ridge regression (λ = 1) on the label matrix itself: signed or soft labels as given."""
    A = np.hstack([data.X, np.ones((len(data.X), 1))])
    W = np.linalg.solve(A.T @ A + np.eye(A.shape[1]), A.T @ data.Y)
    return (np.hstack([data.Xt, np.ones((len(data.Xt), 1))]) @ W).argmax(1)  # type: ignore[no-any-return]


def _sklearn(make: Callable[[int], Any]) -> Trainer:
    """A scikit-learn classifier with its default settings on hard labels (argmax of Y)."""

    def train(data: TrainingSet) -> np.ndarray:
        y = data.hard_labels()
        present = np.unique(y)
        if len(present) < 2:
            # scikit-learn refuses one-class training sets; the only thing such a release can
            # teach is that class, so predict it (accuracy = its share of the test set).
            return np.full(len(data.Xt), present[0])
        model = make(data.seed)
        model.fit(data.X, y)
        return np.asarray(model.predict(data.Xt))

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
    def train(data: TrainingSet) -> np.ndarray | None:
        if kind == "cnn" and data.shape is None:
            return None  # image-shaped data only
        return _train(kind, data)

    return train


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


def _train(kind: str, data: TrainingSet) -> np.ndarray:
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
        return net(torch.tensor(data.Xt, dtype=torch.float32)).argmax(1).numpy()  # type: ignore[no-any-return]


def evaluate(
    release: Release,
    X_test_raw: np.ndarray,
    y_test_raw: np.ndarray,
    *,
    classifiers: tuple[str, ...] = ("linear", "mlp"),
    postprocessing: str = "none",
    epochs: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    Xt = preprocess_test(release, X_test_raw)
    yt = class_indices(release, y_test_raw)
    X = postprocess(release, postprocessing)
    soft = release.hints.soft_labels
    report: dict[str, Any] = {
        "release_id": release.metadata.get("release_id"),
        "mechanism": release.metadata["mechanism"],
        "params": release.metadata["params"],
        "charge": release.metadata.get("charge"),
        "postprocessing": postprocessing,
        "rows": len(X),
        "test_rows": len(yt),
        "chance": float(np.bincount(yt).max() / len(yt)),
        "accuracy": {},
        "fidelity": fidelity(X, release.Y, Xt, yt),
    }
    data = TrainingSet(X, release.Y, Xt, release.image_shape, soft=soft, epochs=epochs, seed=seed)
    report["seconds"] = {}
    for kind in classifiers:
        try:
            trainer = FAMILIES[kind]
        except KeyError:
            raise ValueError(f"unknown model family {kind!r}; known: {CLASSIFIERS}") from None
        start = time.perf_counter()
        pred = trainer(data)
        report["seconds"][kind] = round(time.perf_counter() - start, 3)
        report["accuracy"][kind] = None if pred is None else float((pred == yt).mean())
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
