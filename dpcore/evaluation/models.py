"""The model families a release is measured with: ridge regression on the label matrix,
scikit-learn classifiers (soft labels as weighted rows; kNN by their argmax) and small torch
networks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from dpcore.evaluation.release import Release


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


def _sklearn(make: Callable[[int], Any], weights: bool = True) -> Trainer:
    """A scikit-learn classifier with its default settings: on soft labels (class mixtures)
    through per-class weighted rows (``weighted_rows``), else on hard labels (argmax of Y).
    ``weights`` False: a model that takes no sample weights (kNN) reads class mixtures by
    their argmax — the weighted rows would stack every row once per class, equidistant."""

    def train(data: TrainingSet) -> Prediction:
        weighted = weighted_rows(data.X, data.Y) if data.soft and weights else None
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


def _random_forest(seed: int) -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(random_state=seed)


def _knn(seed: int) -> Any:
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier()


def _torch_family(kind: str) -> Trainer:
    def train(data: TrainingSet) -> Prediction:
        if kind == "cnn" and data.shape is None:
            raise ValueError(NOT_IMAGES)
        return _train(kind, data)

    return train


NOT_IMAGES = (
    "cnn needs image-shaped data (a 2-D feature shape, or d a perfect square ≥ 64 such as 784); "
    "this release is tabular: use logistic, hgb, random_forest, knn or sklearn_mlp"
)

#: Every model family ``evaluate`` can train, by name: the one table the CLI, the worker's
#: owner report and the benches read.
FAMILIES: dict[str, Trainer] = {
    "linear": _linear,
    "logistic": _sklearn(_logistic),
    "sklearn_mlp": _sklearn(_sklearn_mlp),
    "hgb": _sklearn(_hgb),
    "random_forest": _sklearn(_random_forest),
    "knn": _sklearn(_knn, weights=False),
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
    "random_forest": _random_forest,
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


def _soft_targets(Y: np.ndarray) -> torch.Tensor:
    import torch

    # Noisy mixed labels → a distribution over classes (post-processing).
    t = torch.tensor(np.clip(Y, 0, None), dtype=torch.float32)
    return t / t.sum(1, keepdim=True).clamp(min=1e-6)


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
