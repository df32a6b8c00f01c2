"""A release larger than one part goes up to S3 while it is written (real mode: the Celery
worker, moto behind the SigV4 check): parts of the artifact and of the owner's raw copy are
sent before the files are finished, the artifact is completed last and create-only, what is
recorded is what is stored, and a job that fails, or finds its key taken, leaves no part.

The worker's writer is instrumented: it does not finish its file before one of the file's
parts has gone up (an event, never a pace), so a part sent early is seen, not hoped for."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.artifacts import ArtifactWriter
from service.releases import keys
from service.storage import S3ObjectStore, sha256_hex
from tests.conftest import Harness, npz_bytes
from worker import writing

PART = 5 * 1024 * 1024
ROWS = 4_500  # 4 500 × (784 + 3) × 4 B ≈ 14 MB: three parts
WAIT_S = 60.0


class Sent:
    """The keys of the worker store's parts, as they go up."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.changed = threading.Condition()

    def add(self, key: str) -> None:
        with self.changed:
            self.keys.append(key)
            self.changed.notify_all()

    def wait_for(self, name: str) -> bool:
        """Whether a part of a key ending in ``/name`` has gone up (waiting for one up to the
        safety net)."""
        with self.changed:
            return self.changed.wait_for(
                lambda: any(k.endswith(f"/{name}") for k in self.keys), WAIT_S
            )


@pytest.fixture
def store(real_services: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> S3ObjectStore:
    s3 = real_services["worker_runtime"].store
    assert isinstance(s3, S3ObjectStore)
    monkeypatch.setattr(s3, "part_bytes", PART)
    return s3


@pytest.fixture
def sent(store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch) -> Sent:
    seen = Sent()
    upload_part = store.client.upload_part

    def spy(**kw: Any) -> Any:
        answer = upload_part(**kw)
        seen.add(kw["Key"])
        return answer

    monkeypatch.setattr(store.client, "upload_part", spy)
    return seen


def _hold_open(
    monkeypatch: pytest.MonkeyPatch, sent: Sent, then: Callable[[Path], None] | None = None
) -> list[tuple[str, bool]]:
    """The worker's writers finish their file (``close``) only once one of its parts went up,
    recorded as (file name, True), or the safety net ran out (False); ``then(path)`` runs at
    that point."""
    seen: list[tuple[str, bool]] = []

    class HeldOpen(ArtifactWriter):
        def close(self) -> None:
            seen.append((self.path.name, sent.wait_for(self.path.name)))
            try:
                if then is not None:
                    then(self.path)
            except BaseException:
                self._abandon()  # as a writer that fails while finishing does
                raise
            super().close()

    monkeypatch.setattr(writing, "ArtifactWriter", HeldOpen)
    return seen


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (600, 784), dtype=np.uint8)
    labels = rng.integers(0, 3, 600)
    meta = {
        "name": "images",
        "feature_range": [0, 255],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 50.0, "delta": 1e-5},
    }
    r = h.upload(owner, npz_bytes(images, labels), metadata=meta)
    assert r.status_code == 201, r.text
    return owner, r.json()["id"]


def _release(h: Harness, owner: str, dataset_id: str) -> str:
    body = h.release_body(dataset_id, params={"mixture_degree": 8, "n_samples": ROWS}, epsilon=2.0)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    release_id: str = r.json()["id"]
    return release_id


def _pending(store: S3ObjectStore) -> list[Any]:
    return store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


def test_a_release_goes_up_while_it_is_written(
    real: Harness, store: S3ObjectStore, sent: Sent, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = real
    seen = _hold_open(monkeypatch, sent)
    owner, ds = _dataset(h)
    rid = _release(h, owner, ds)
    done = h.wait(owner, rid)
    assert done["status"] == "succeeded", done
    # Both files (noise takes values out of the declared range: the raw copy is kept) had a
    # part stored before their writer finished them.
    assert sorted(seen) == [("raw.npz", True), ("release.npz", True)]
    data = h.download(owner, rid)
    assert done["artifact"]["bytes"] == len(data) > 2 * PART
    assert done["artifact"]["sha256"] == sha256_hex(data)
    # Stored in three parts, each with its SHA-256 (S3's composite checksum is theirs).
    answer = store.client.get_object(
        Bucket=store.bucket, Key=keys.artifact(rid, "npz"), ChecksumMode="ENABLED"
    )
    assert answer["Body"].read() == data
    digests = b"".join(
        hashlib.sha256(data[i : i + PART]).digest() for i in range(0, len(data), PART)
    )
    composite = base64.b64encode(hashlib.sha256(digests).digest()).decode()
    assert answer["ChecksumSHA256"] == f"{composite}-3"
    raw = h.as_drawn(owner, rid)
    assert raw is not None and len(raw) > 2 * PART
    assert _pending(store) == []


def test_a_job_that_fails_after_parts_went_up_leaves_none(
    real: Harness, store: S3ObjectStore, sent: Sent, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(path: Path) -> None:
        if path.name == "release.npz":
            raise OSError("the scratch disk failed")

    seen = _hold_open(monkeypatch, sent, fail)
    owner, ds = _dataset(h := real)
    rid = _release(h, owner, ds)
    done = h.wait(owner, rid)
    assert done["status"] == "failed", done
    assert ("release.npz", True) in seen  # its parts had gone up
    assert _pending(store) == []  # aborted: no part stays
    for key in (keys.artifact(rid, "npz"), keys.raw(rid, "npz")):
        assert not store.exists(key)


def test_an_artifact_stored_meanwhile_is_not_replaced(
    real: Harness, store: S3ObjectStore, sent: Sent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another attempt stored the artifact while this one wrote: the completion is refused
    (create-only), the upload aborted, and the release records the stored object."""
    other = b"another attempt's release"

    def race(path: Path) -> None:
        if path.name == "release.npz":
            (key,) = {k for k in sent.keys if k.endswith("/release.npz")}
            store.put(key, other)

    _hold_open(monkeypatch, sent, race)
    owner, ds = _dataset(h := real)
    rid = _release(h, owner, ds)
    done = h.wait(owner, rid)
    assert done["status"] == "succeeded", done
    assert done["artifact"] == {
        **done["artifact"],
        "bytes": len(other),
        "sha256": sha256_hex(other),
    }
    assert store.get(keys.artifact(rid, "npz")) == other
    assert _pending(store) == []
