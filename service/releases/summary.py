"""A succeeded release's file summarised for the console (``GET /releases/{id}/summary``):
its shape, columns, sample rows and per-column histograms.

Everything here is post-processing of a differentially private release: it reads the very
file ``GET /releases/{id}/download`` serves (never the owner's raw rows, never the owner-side
provenance file) and the public metadata that travels with it, so it costs no privacy and
anyone who may download the release may read its summary (docs/privacy.md).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dpcore import release_layout
from dpcore.evaluation import Release as LoadedRelease
from dpcore.evaluation import load_release_file
from dpcore.table import decode
from service.config import Settings
from service.errors import Conflict
from service.models import Release
from service.releases import keys
from service.releases.schemas import (
    ReleaseSummary,
    SummaryHistogram,
    SummarySample,
    SummaryValueRange,
)
from service.storage import ObjectStore

# The rows shown: SAMPLE_ROWS spread evenly over the file (rows ⌊i·n/k⌋), so a release
# written class by class (DP-CDA's) shows every class, not the first class's rows only. The
# rows are already a DP release, so which of them are shown is post-processing whatever the
# rule; a fixed public rule keeps the answer the same on every call and for every reader.
SAMPLE_ROWS = 64
BINS = 20
# Significant digits of the sampled values: enough for a picture or a glance, and a 28 × 28
# image sample stays a few hundred kilobytes of JSON.
DIGITS = 6
# The CSV release's metadata travels beside it as this further artifact (worker/metadata.py).
METADATA_ARTIFACT = "metadata.json"


class SummaryTooLarge(Conflict):
    """The release file is larger than DPRELEASE_SUMMARY_MAX_BYTES: the API would hold it in
    memory to summarise it (409; download it instead)."""

    code = "summary_too_large"


def summarise(release: Release, store: ObjectStore, settings: Settings) -> ReleaseSummary:
    """The summary of a succeeded release (the caller checked access and status)."""
    assert release.artifact_key is not None
    size = release.artifact_bytes or 0
    if size > settings.summary_max_bytes:
        raise SummaryTooLarge(
            f"release {release.id}'s file is {size} bytes, more than this server summarises "
            f"({settings.summary_max_bytes}, DPRELEASE_SUMMARY_MAX_BYTES): download it instead",
            detail={"artifact_bytes": size, "limit_bytes": settings.summary_max_bytes},
        )
    metadata = companion_metadata(release, store)
    with local_file(store, release.artifact_key, settings) as path:
        loaded = load_release_file(path, metadata)
    return _summary(loaded)


def companion_metadata(release: Release, store: ObjectStore) -> dict[str, Any] | None:
    """A CSV release's metadata: its public ``metadata.json`` artifact (NPZ and Parquet files
    carry theirs inside)."""
    if not any(a["name"] == METADATA_ARTIFACT for a in release.artifacts or ()):
        return None
    meta: dict[str, Any] = json.loads(store.get(keys.extra_artifact(release.id, METADATA_ARTIFACT)))
    return meta


@contextmanager
def local_file(store: ObjectStore, key: str, settings: Settings) -> Iterator[Path]:
    """The stored object as a local file: the store's own (embedded mode), else a temporary
    copy streamed from S3 in download-sized chunks."""
    path = store.local_path(key)
    if path is not None:
        yield path
        return
    stream = store.open_stream(key, chunk_bytes=settings.download_chunk_bytes)
    with tempfile.TemporaryDirectory(prefix="dprelease-summary-") as folder:
        copy = Path(folder) / "release"
        try:
            with copy.open("wb") as handle:
                for chunk in stream.chunks:
                    handle.write(chunk)
        finally:
            stream.close()
        yield copy


def _summary(loaded: LoadedRelease) -> ReleaseSummary:
    meta = loaded.metadata
    X, Y = loaded.X, loaded.Y
    layout = release_layout.read_layout(meta)
    features = list(layout.features) if layout is not None else _feature_names(meta, X)
    labels = layout.label_columns if layout is not None else _label_names(meta, Y)
    shape = _image_shape(loaded)
    declared = _declared_range(meta, X.shape[1])
    shown = sample_rows(int(X.shape[0]))
    if shape is not None:
        histograms = []
    elif layout is not None and layout.table:
        histograms = _table_histograms(X, layout, declared)
    else:
        histograms = _feature_histograms(X, features, declared)
    histograms += _label_histograms(Y, labels, layout)
    return ReleaseSummary(
        rows=int(X.shape[0]),
        columns=[*features, *labels],
        feature_columns=features,
        label_columns=labels,
        label_kind=layout.kind if layout is not None else None,
        classes=[str(c) for c in meta.get("classes", ())],
        feature_shape=list(shape) if shape is not None else None,
        value_range=declared,
        display_range=_display_range(declared, X[shown]),
        samples=_samples(shown, X[shown], Y[shown], layout),
        histograms=histograms,
    )


def _feature_names(meta: Mapping[str, Any], X: np.ndarray) -> list[str]:
    names = [str(n) for n in meta.get("feature_names", ())]
    return names if len(names) == X.shape[1] else [f"x{j}" for j in range(X.shape[1])]


def _label_names(meta: Mapping[str, Any], Y: np.ndarray) -> list[str]:
    classes = [str(c) for c in meta.get("classes", ())]
    return classes if len(classes) == Y.shape[1] else [f"y{j}" for j in range(Y.shape[1])]


def _image_shape(loaded: LoadedRelease) -> tuple[int, int] | None:
    """(h, w) when the rows are images of the declared 2-D shape (a projection's rows, of
    another width, are not)."""
    try:
        shape = loaded.image_shape
    except (KeyError, TypeError, ValueError):
        return None
    if shape is None or len(shape) != 2 or shape[0] * shape[1] != loaded.X.shape[1]:
        return None
    return int(shape[0]), int(shape[1])


def _declared_range(meta: Mapping[str, Any], width: int) -> SummaryValueRange | None:
    """Per feature, the owner's declared [lo, hi] when the release is in the data's units
    (its ``transform`` says ``raw``): public bounds. Releases in a mechanism's own scale
    (projections, centred combinations, older releases) have none."""
    transform = meta.get("transform")
    if not isinstance(transform, Mapping) or transform.get("output", "raw") != "raw":
        return None
    lo, hi = transform.get("lo"), transform.get("hi")
    if not isinstance(lo, list) or not isinstance(hi, list) or not len(lo) == len(hi) == width:
        return None
    return SummaryValueRange(lo=[float(v) for v in lo], hi=[float(v) for v in hi])


def _display_range(declared: SummaryValueRange | None, rows: np.ndarray) -> list[float] | None:
    """One [lo, hi] for drawing the sampled rows (grey levels): the declared bounds' extent,
    else the sampled values' own."""
    if declared is not None:
        return [min(declared.lo), max(declared.hi)]
    finite = rows[np.isfinite(rows)]
    if finite.size == 0:
        return None
    return [_round(float(finite.min())), _round(float(finite.max()))]


def _round(value: float) -> float:
    return float(f"{value:.{DIGITS}g}") if math.isfinite(value) else value


def sample_rows(n: int) -> np.ndarray:
    """The indices of the rows shown: min(n, SAMPLE_ROWS) of them, ⌊i·n/k⌋ for i < k, in
    file order (every row when the file has at most SAMPLE_ROWS)."""
    k = min(n, SAMPLE_ROWS)
    return (np.arange(k, dtype=np.int64) * n) // max(k, 1)


def _samples(
    rows: np.ndarray, X: np.ndarray, Y: np.ndarray, layout: release_layout.Layout | None
) -> list[SummarySample]:
    """The rows as the file holds them: their index, features, then the label (an exact
    label as its class; other kinds as the label columns' values)."""
    if layout is not None and layout.kind == "exact" and len(Y):
        label_values: list[Any] = layout.class_values(Y)
    else:
        label_values = [[_round(float(v)) for v in row] for row in Y]
    return [
        SummarySample(row=int(row), features=[_round(float(v)) for v in x], label=label)
        for row, x, label in zip(rows, X, label_values, strict=True)
    ]


def _histogram(
    column: str, values: np.ndarray, lo: float | None, hi: float | None
) -> SummaryHistogram:
    """``BINS`` equal bins over [lo, hi] (the declared range), else over the column's own
    min–max; values outside the declared range are counted as below or above it."""
    values = values[np.isfinite(values)]
    source: Literal["declared", "release"] = (
        "declared" if lo is not None and hi is not None else "release"
    )
    if lo is None or hi is None:
        lo = float(values.min()) if values.size else 0.0
        hi = float(values.max()) if values.size else 1.0
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5  # a constant column: one bin holds it
    counts, edges = np.histogram(values, bins=BINS, range=(lo, hi))
    return SummaryHistogram(
        column=column,
        kind="numeric",
        range_source=source,
        edges=[_round(float(e)) for e in edges],
        counts=[int(c) for c in counts],
        below=int((values < lo).sum()),
        above=int((values > hi).sum()),
    )


def _feature_histograms(
    X: np.ndarray, names: Sequence[str], declared: SummaryValueRange | None
) -> list[SummaryHistogram]:
    out = []
    for j, name in enumerate(names):
        lo = declared.lo[j] if declared is not None else None
        hi = declared.hi[j] if declared is not None else None
        out.append(_histogram(name, X[:, j], lo, hi))
    return out


def _table_histograms(
    X: np.ndarray, layout: release_layout.Layout, declared: SummaryValueRange | None
) -> list[SummaryHistogram]:
    """A declared table's columns as the file holds them (``dpcore.table``): a categorical
    column's rows per category, a numeric one's bins over its declared bounds; each with its
    missing entries counted apart."""
    out = []
    for column, (values, missing) in zip(layout.table, decode(X, layout.table), strict=True):
        if column.type == "categorical":
            held = values[~missing]
            counts = [
                int(np.sum(held == c)) for c in np.asarray(column.categories, dtype=held.dtype)
            ]
            histogram = SummaryHistogram(
                column=column.name,
                kind="categorical",
                categories=[str(c) for c in column.categories],
                counts=counts,
            )
        else:
            j = column.features[0]
            lo = declared.lo[j] if declared is not None else None
            hi = declared.hi[j] if declared is not None else None
            histogram = _histogram(column.name, values[~missing].astype(np.float64), lo, hi)
        out.append(histogram.model_copy(update={"missing": int(missing.sum())}))
    return out


def _label_histograms(
    Y: np.ndarray,
    names: Sequence[str],
    layout: release_layout.Layout | None,
) -> list[SummaryHistogram]:
    """An exact label: the rows per class. Proportions: each class column over [0, 1]. Other
    label columns (signed combinations): over their own min–max."""
    if layout is not None and layout.kind == "exact":
        return [
            SummaryHistogram(
                column=layout.label,
                kind="categorical",
                categories=[str(c) for c in layout.classes],
                counts=[int(c) for c in np.asarray(Y).sum(axis=0).round()],
            )
        ]
    unit = layout is not None and layout.kind == "proportions" and not layout.as_drawn
    return [
        _histogram(name, Y[:, j], 0.0 if unit else None, 1.0 if unit else None)
        for j, name in enumerate(names)
    ]
