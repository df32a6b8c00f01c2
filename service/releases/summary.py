"""A succeeded release's file summarised for the console (``GET /releases/{id}/summary``):
its shape, columns, sample rows and per-column histograms.

Everything here is post-processing of a differentially private release: it reads the very
file ``GET /releases/{id}/download`` serves (never the owner's raw rows, never the owner-side
provenance file) and the public metadata that travels with it, so it costs no privacy and
anyone who may download the release may read its summary (docs/privacy.md).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dpcore import release_layout
from dpcore.conversion import count_rows, embedded_metadata, read_chunks
from dpcore.evaluation import Release as LoadedRelease
from dpcore.evaluation import load_release_file
from dpcore.evaluation.release import detect_format
from service.config import Settings
from service.errors import Conflict
from service.models import Release
from service.releases import keys
from service.releases.schemas import ReleaseSummary, SummarySample, SummaryValueRange
from service.releases.summary_columns import (
    Chunk,
    Column,
    feature_columns,
    label_columns,
    rounded,
    table_columns,
)
from service.storage import ObjectStore

# The rows shown: SAMPLE_ROWS spread evenly over the file (rows ⌊i·n/k⌋), so a release
# written class by class (DP-CDA's) shows every class, not the first class's rows only. The
# rows are already a DP release, so which of them are shown is post-processing whatever the
# rule; a fixed public rule keeps the answer the same on every call and for every reader.
SAMPLE_ROWS = 64
# Values per chunk of rows read (float64: 32 MiB), whatever the file's size.
CHUNK_VALUES = 1 << 22
# The CSV release's metadata travels beside it as this further artifact (worker/metadata.py).
METADATA_ARTIFACT = "metadata.json"


class SummaryTooLarge(Conflict):
    """The release file is larger than DPRELEASE_SUMMARY_MAX_BYTES: reading it would take
    this request too long (409; download it instead)."""

    code = "summary_too_large"


def summarise(release: Release, store: ObjectStore, settings: Settings) -> ReleaseSummary:
    """The summary of a succeeded release (the caller checked access and status), read chunk
    by chunk (``summarise_file``)."""
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
        return summarise_file(path, metadata)


def summarise_file(path: Path, metadata: dict[str, Any] | None) -> ReleaseSummary:
    """The summary of the release file at ``path`` (``metadata``: a CSV release's companion
    file; NPZ and Parquet files carry theirs). Memory holds one chunk of rows
    (``CHUNK_VALUES`` values) and the sampled rows, whatever the file's size; a release made
    before layouts (no chunked reader) or holding no row is read whole."""
    fmt = detect_format(path)
    meta = metadata if metadata is not None else embedded_metadata(path)
    layout = release_layout.read_layout(meta) if meta is not None else None
    rows = count_rows(path, fmt, layout) if layout is not None else 0
    if layout is None or meta is None or rows == 0:
        loaded = load_release_file(path, metadata)
        X, Y = np.asarray(loaded.X, np.float64), np.asarray(loaded.Y, np.float64)
        return _summary(loaded.metadata, len(X), X.shape[1], Y.shape[1], lambda: iter([(X, Y)]))
    width, classes = len(layout.features), len(layout.classes)
    chunk_rows = max(1, CHUNK_VALUES // max(width + classes, 1))
    return _summary(meta, rows, width, classes, lambda: read_chunks(path, fmt, meta, chunk_rows))


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


Chunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]


def _summary(
    meta: Mapping[str, Any], rows: int, width: int, classes: int, chunks: Chunks
) -> ReleaseSummary:
    """The summary from the file's (X, Y) chunks, in file order; ``chunks`` is called again
    for a second pass when a column is binned over its own min–max, which the first finds."""
    layout = release_layout.read_layout(meta)
    features = list(layout.features) if layout is not None else _feature_names(meta, width)
    labels = layout.label_columns if layout is not None else _label_names(meta, classes)
    shape = _image_shape(meta, width, classes)
    declared = _declared_range(meta, width)
    columns: list[Column] = []
    if shape is None and layout is not None and layout.table:
        columns = table_columns(layout, declared)
    elif shape is None:
        columns = feature_columns(features, declared)
    columns += label_columns(labels, layout)
    if any(c.needs_range for c in columns):
        for X, Y in chunks():
            chunk = Chunk(np.asarray(X, np.float64), np.asarray(Y, np.float64), layout)
            for c in columns:
                c.scan(chunk)
    shown = sample_rows(rows)
    picked_X, picked_Y, offset = [], [], 0
    for X, Y in chunks():
        chunk = Chunk(np.asarray(X, np.float64), np.asarray(Y, np.float64), layout)
        here = shown[(shown >= offset) & (shown < offset + len(chunk.X))] - offset
        picked_X.append(chunk.X[here])
        picked_Y.append(chunk.Y[here])
        for c in columns:
            c.add(chunk)
        offset += len(chunk.X)
    X_shown = np.concatenate(picked_X) if picked_X else np.zeros((0, width))
    Y_shown = np.concatenate(picked_Y) if picked_Y else np.zeros((0, classes))
    return ReleaseSummary(
        rows=rows,
        columns=[*features, *labels],
        feature_columns=features,
        label_columns=labels,
        label_kind=layout.kind if layout is not None else None,
        classes=[str(c) for c in meta.get("classes", ())],
        feature_shape=list(shape) if shape is not None else None,
        value_range=declared,
        display_range=_display_range(declared, X_shown),
        samples=_samples(shown, X_shown, Y_shown, layout),
        histograms=[c.result() for c in columns],
    )


def _feature_names(meta: Mapping[str, Any], width: int) -> list[str]:
    names = [str(n) for n in meta.get("feature_names", ())]
    return names if len(names) == width else [f"x{j}" for j in range(width)]


def _label_names(meta: Mapping[str, Any], classes: int) -> list[str]:
    names = [str(c) for c in meta.get("classes", ())]
    return names if len(names) == classes else [f"y{j}" for j in range(classes)]


def _image_shape(meta: Mapping[str, Any], width: int, classes: int) -> tuple[int, int] | None:
    """(h, w) when the rows are images of the declared 2-D shape (a projection's rows, of
    another width, are not)."""
    try:
        shape = LoadedRelease(np.zeros((0, width)), np.zeros((0, classes)), dict(meta)).image_shape
    except (KeyError, TypeError, ValueError):
        return None
    if shape is None or len(shape) != 2 or shape[0] * shape[1] != width:
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
    return [rounded(float(finite.min())), rounded(float(finite.max()))]


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
        label_values = [[rounded(float(v)) for v in row] for row in Y]
    return [
        SummarySample(row=int(row), features=[rounded(float(v)) for v in x], label=label)
        for row, x, label in zip(rows, X, label_values, strict=True)
    ]
