"""Every model family of ``dpcore.evaluation.FAMILIES`` learns what a release teaches, and only
that: a separable toy release is learned far above chance, the same release with its labels
shuffled is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dpcore.evaluation import CLASSIFIERS, FAMILIES, Release, evaluate, families_for
from dpcore.preprocessing import one_hot, unit_features
from dprelease_cli.main import cli

SHAPE = (8, 8)
CLASSES = 3


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8×8 images in [0, 10]: noise everywhere, class c lights rows 2c..2c+1 brightly."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    X = rng.uniform(0, 3, size=(n, *SHAPE))
    for c in range(CLASSES):
        X[y == c, 2 * c : 2 * c + 2, :] += 7.0
    return X.reshape(n, -1), y


def _release(X_raw: np.ndarray, y: np.ndarray) -> Release:
    lo, hi = np.zeros(X_raw.shape[1]), np.full(X_raw.shape[1], 10.0)
    metadata = {
        # Not a registered mechanism: the default hints (unit-scale features, soft labels,
        # image-shaped when the shape says so), as an analyst's own release would be read.
        "mechanism": "toy",
        "params": {},
        "classes": list(range(CLASSES)),
        "feature_shape": list(SHAPE),
        "feature_range": {"lo": lo.tolist(), "hi": hi.tolist()},
    }
    return Release(unit_features(X_raw, lo, hi), one_hot(y, CLASSES), metadata)


@pytest.fixture(scope="module")
def toy() -> tuple[Release, np.ndarray, np.ndarray]:
    X, y = _images(300, 0)
    X_test, y_test = _images(300, 1)
    return _release(X, y), X_test, y_test


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_learns_a_separable_release(
    toy: tuple[Release, np.ndarray, np.ndarray], family: str
) -> None:
    release, X_test, y_test = toy
    report = evaluate(release, X_test, y_test, classifiers=(family,), epochs=15)
    assert report["chance"] < 0.4
    assert report["accuracy"][family] > 0.9
    assert report["seconds"][family] >= 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_is_near_chance_on_shuffled_labels(
    toy: tuple[Release, np.ndarray, np.ndarray], family: str
) -> None:
    release, X_test, y_test = toy
    # Same features, labels permuted: no family may find the class in the features, so a
    # family that scored from something other than the features it was given fails here.
    shuffled = Release(release.X, np.random.default_rng(2).permutation(release.Y), release.metadata)
    report = evaluate(shuffled, X_test, y_test, classifiers=(family,), epochs=15)
    assert report["accuracy"][family] < 0.5


def test_cnn_needs_image_shaped_data(toy: tuple[Release, np.ndarray, np.ndarray]) -> None:
    release, X_test, y_test = toy
    flat = Release(release.X, release.Y, {**release.metadata, "feature_shape": [64]})
    # Asked by name on tabular data: refused with a message saying what to use instead (it
    # used to train nothing and report null, after the other families ran).
    with pytest.raises(ValueError, match="cnn needs image-shaped data"):
        evaluate(flat, X_test, y_test, classifiers=("cnn", "linear"), epochs=1)
    with pytest.raises(ValueError, match="cnn needs image-shaped data"):
        families_for(flat, ("cnn",))
    # 'all' trains every family that applies: the CNN only on images.
    assert "cnn" not in families_for(flat, ("all",))
    assert families_for(release, ("all",)) == CLASSIFIERS


@pytest.mark.parametrize("family", ["logistic", "sklearn_mlp", "hgb", "random_forest", "knn"])
def test_one_class_release_predicts_that_class(
    toy: tuple[Release, np.ndarray, np.ndarray], family: str
) -> None:
    release, X_test, y_test = toy
    Y = np.zeros_like(release.Y)
    Y[:, 1] = 1.0
    report = evaluate(
        Release(release.X, Y, release.metadata), X_test, y_test, classifiers=(family,)
    )
    assert report["accuracy"][family] == pytest.approx(float(np.mean(y_test == 1)))


def test_knn_reads_class_mixtures_by_their_argmax(
    toy: tuple[Release, np.ndarray, np.ndarray],
) -> None:
    release, X_test, y_test = toy
    # Mixtures that keep each row's class on top (0.6 of it, 0.2 to each other class): kNN
    # learns as from the exact labels, where weighted rows (each row once per class) would
    # leave every neighbour tied.
    mixed = Release(release.X, release.Y * 0.4 + 0.2, release.metadata)
    exact = evaluate(release, X_test, y_test, classifiers=("knn",))
    report = evaluate(mixed, X_test, y_test, classifiers=("knn",))
    assert report["accuracy"]["knn"] == exact["accuracy"]["knn"] > 0.9


def test_hard_labels_are_the_argmax_of_signed_rows(
    toy: tuple[Release, np.ndarray, np.ndarray],
) -> None:
    release, X_test, y_test = toy
    # Signed label combinations (a mechanism's noisy labels): sign flips of the non-top
    # entries keep the argmax, so the hard-label families must learn as well as before.
    Y = release.Y * 2.0 - 1.0
    report = evaluate(
        Release(release.X, Y, release.metadata), X_test, y_test, classifiers=("logistic",)
    )
    assert report["accuracy"]["logistic"] > 0.9


def test_unknown_family_is_refused(toy: tuple[Release, np.ndarray, np.ndarray]) -> None:
    release, X_test, y_test = toy
    with pytest.raises(ValueError, match="unknown model family"):
        evaluate(release, X_test, y_test, classifiers=("svm",))


def test_cli_all_reports_accuracy_and_seconds_per_family(
    toy: tuple[Release, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    release, X_test, y_test = toy
    release_path, test_path = tmp_path / "release.npz", tmp_path / "test.npz"
    np.savez(release_path, X=release.X, y=release.Y, metadata=json.dumps(release.metadata))
    np.savez(test_path, X=X_test, y=y_test)
    args = ["evaluate", str(release_path), "--test", str(test_path), "--epochs", "15"]
    result = CliRunner().invoke(cli, [*args, "--classifier", "all"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["accuracy"]) == set(CLASSIFIERS) == set(report["seconds"])
    assert all(report["accuracy"][f] > 0.9 for f in CLASSIFIERS)
