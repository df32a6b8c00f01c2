"""The analyst's side: real records read from a file, mapped into a release's feature space
with public facts only, scaled as every model is fed, and free post-processing of the release."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from dpcore.categorical import encode_declared
from dpcore.evaluation.release import Release, detect_format, read_table
from dpcore.preprocessing import RowTransform, unit_features

# Analyst-side extras on top of what the release already is (its own `postprocess` ran in the
# worker): a Gaussian blur of image rows, or projection on the release's top 50 components.
POSTPROCESSING = ("none", "blur", "pca")

#: Label names an analyst's test table is most likely to use, tried in order when no
#: ``label_column`` is given (a release's own label column is in its metadata's layout).
LABEL_COLUMNS = ("y", "label", "class", "target")


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
    table = read_table(path, fmt)
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
