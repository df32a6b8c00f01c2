"""One release, every format: ``GET /releases/{id}/download?format=`` in a format other than
the release's own converts its stored file (``dpcore.conversion``) on the first request and
keeps the result (``keys.converted``), so later downloads, presigned ones included, serve the
stored copy. Converting reads the released file and its public metadata only: post-processing,
no charge, no ledger entry. ``metadata.json`` is served for every release: a CSV release
stores its own, an NPZ or Parquet release's is read from its file on the first request and
kept (``keys.public_metadata``).

Work per request is bounded: files over ``conversion_max_bytes`` are refused (409
``conversion_too_large``), at most ``max_concurrent_conversions`` run in one API process
(503 ``conversions_busy`` with Retry-After past it), and a conversion holds one chunk of rows
in memory and one temporary file on disk.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.conversion import ConversionError, convert, embedded_metadata
from dpcore.release_layout import LayoutError
from service.config import Settings
from service.errors import Conflict, ConversionsBusy
from service.models import Release
from service.releases import keys
from service.releases.summary import METADATA_ARTIFACT, companion_metadata, local_file
from service.storage import ObjectExists, ObjectStore

_ARRAY = "{name}.npy"


class ConversionTooLarge(Conflict):
    """A release file larger than this server converts (409)."""

    code = "conversion_too_large"


class NotConvertible(Conflict):
    """A stored release file that cannot be converted (one made before release layouts)
    (409)."""

    code = "not_convertible"


_lock = threading.Lock()
_active = 0


@contextmanager
def _slot(settings: Settings) -> Iterator[None]:
    global _active
    cap = settings.max_concurrent_conversions
    with _lock:
        if _active >= cap:
            retry = settings.upload_retry_after_s
            raise ConversionsBusy(
                f"this server already converts {cap} release file(s); retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_conversions": cap},
            )
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1


def converted_key(release: Release, fmt: str, store: ObjectStore, settings: Settings) -> str:
    """The stored key of ``release``'s file in ``fmt`` (another format than its own),
    converting and storing it first when no earlier request did."""
    key = keys.converted(release.id, fmt)
    if store.exists(key):
        return key
    assert release.artifact_key is not None  # the caller checked the release succeeded
    size = release.artifact_bytes or 0
    if size > settings.conversion_max_bytes:
        raise ConversionTooLarge(
            f"release {release.id}'s file is {size} bytes, more than this server converts "
            f"({settings.conversion_max_bytes}, DPRELEASE_CONVERSION_MAX_BYTES): download it "
            f"as {release.format} and convert it yourself",
            detail={"artifact_bytes": size, "limit_bytes": settings.conversion_max_bytes},
        )
    with (
        _slot(settings),
        tempfile.TemporaryDirectory(prefix="dprelease-convert-") as folder,
        local_file(store, release.artifact_key, settings) as source,
    ):
        metadata = _metadata(release, store, source)
        target = Path(folder) / f"release.{fmt}"
        try:
            convert(
                source,
                target,
                fmt,
                metadata,
                arrays=_arrays(release, store, source, metadata) if fmt == "npz" else None,
                array_names=_array_places(release, metadata),
            )
        except (ConversionError, LayoutError) as exc:
            raise NotConvertible(
                f"release {release.id}'s {release.format} file cannot be converted: {exc}"
            ) from None
        with suppress(ObjectExists):  # a concurrent request stored the same conversion
            store.put_file(key, target)
    return key


def metadata_key(release: Release, store: ObjectStore, settings: Settings) -> str | None:
    """The stored key of the release's ``metadata.json``: a CSV release's own artifact, else
    the metadata its file carries, kept on the first request. None for a file without it."""
    if _has_metadata_artifact(release):
        return keys.extra_artifact(release.id, METADATA_ARTIFACT)
    key = keys.public_metadata(release.id)
    if store.exists(key):
        return key
    assert release.artifact_key is not None
    with local_file(store, release.artifact_key, settings) as source:
        metadata = embedded_metadata(source)
    if metadata is None:
        return None
    with suppress(ObjectExists):
        store.put(key, json.dumps(metadata, sort_keys=True).encode())
    return key


def _has_metadata_artifact(release: Release) -> bool:
    return any(a["name"] == METADATA_ARTIFACT for a in release.artifacts or ())


def _metadata(release: Release, store: ObjectStore, source: Path) -> dict[str, Any]:
    """The release file's metadata: a CSV release's companion file, else its own."""
    metadata = companion_metadata(release, store) or embedded_metadata(source)
    if metadata is None:
        raise NotConvertible(f"release {release.id}'s file carries no metadata")
    return metadata


def _array_places(release: Release, metadata: Mapping[str, Any]) -> dict[str, str]:
    """Where each public array travels beside a table format: the release's further file
    (a table release's own), or inside its NPZ download (an NPZ release's)."""
    names = list(metadata.get("arrays") or ())
    if release.format == "npz":
        return {
            n: f"{n}.npy inside the release's NPZ (GET /releases/{release.id}/download)"
            for n in names
        }
    return {n: _ARRAY.format(name=n) for n in names}


def _arrays(
    release: Release, store: ObjectStore, source: Path, metadata: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """The mechanism's public arrays for an NPZ: its further ``<name>.npy`` files (a table
    release's), or the source NPZ's own members."""
    out: dict[str, np.ndarray] = {}
    for name in metadata.get("arrays") or ():
        if release.format == "npz":
            with np.load(source, allow_pickle=False) as npz:
                out[name] = npz[name]
            continue
        content = store.get(keys.extra_artifact(release.id, _ARRAY.format(name=name)))
        with tempfile.TemporaryFile() as handle:
            handle.write(content)
            handle.seek(0)
            out[name] = np.load(handle, allow_pickle=False)
    return out
