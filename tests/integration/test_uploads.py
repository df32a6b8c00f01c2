"""Upload validation through the API: 422 with an actionable message, and nothing stored."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, select

from service.models import Dataset
from tests.conftest import Harness, npz_bytes, toy_dataset


def _stored_objects(h: Harness) -> int:
    store = h.runtime.store
    if hasattr(store, "root"):
        return sum(1 for p in Path(store.root).rglob("*") if p.is_file())
    listing = store.client.list_objects_v2(Bucket=store.bucket)  # type: ignore[attr-defined]
    return int(listing.get("KeyCount", 0))


def _dataset_rows(h: Harness) -> int:
    with h.runtime.session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(Dataset)) or 0)


def _csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


GOOD = {"name": "t", "feature_range": [0, 13], "budget": {"epsilon": 1, "delta": 1e-5}}


def _cases() -> list[tuple[str, bytes, dict[str, object], str]]:
    X, y = toy_dataset(n=20)
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]).assign(label=y)
    bad_num = frame.astype({"f1": object})
    bad_num.loc[3, "f1"] = "abc"
    nan_X = X.copy()
    nan_X[2, 1] = np.nan
    return [
        ("empty.npz", b"", GOOD, "empty"),
        ("garbage.npz", b"\x00\x01garbage", GOOD, "could not be read"),
        ("data.txt", b"a,b\n1,2\n", GOOD, "csv"),
        ("nan.npz", npz_bytes(nan_X, y), GOOD, "NaN"),
        ("shape.npz", npz_bytes(X, y[:-1]), GOOD, "20"),
        ("classes.npz", npz_bytes(X, y), {**GOOD, "classes": [0, 1]}, "not among the declared"),
        ("d.csv", _csv(bad_num), {**GOOD, "label_column": "label"}, "f1"),
        ("d.csv", _csv(frame), {**GOOD, "label_column": "nope"}, "nope"),
        ("d.npz", npz_bytes(X, y), {**GOOD, "budget": {"epsilon": 0, "delta": 1e-5}}, "epsilon"),
        ("d.npz", npz_bytes(X, y), {**GOOD, "budget": {"epsilon": 1, "delta": 1}}, "delta"),
        ("d.npz", npz_bytes(X, y), {**GOOD, "feature_range": [1, 1]}, "lo < hi"),
        ("d.npz", npz_bytes(X, y), {**GOOD, "feature_range": {"0": [0, 1]}}, "feature_range"),
    ]


@pytest.mark.modes("real")
@pytest.mark.parametrize("case", range(len(_cases())))
def test_invalid_uploads_store_nothing(harness: Harness, case: int) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    filename, content, meta, phrase = _cases()[case]
    objects, rows = _stored_objects(h), _dataset_rows(h)
    r = h.upload(owner, content, filename=filename, metadata=dict(meta))
    assert r.status_code == 422, r.text
    assert phrase.lower() in r.json()["error"]["message"].lower(), r.text
    assert (_stored_objects(h), _dataset_rows(h)) == (objects, rows)


def test_bad_metadata_json(embedded: Harness) -> None:
    owner, _ = embedded.new_key("owner")
    r = embedded.client.post(
        "/datasets",
        files={"file": ("d.npz", npz_bytes(*toy_dataset()))},
        data={"metadata": "{not json"},
        headers=embedded.headers(owner),
    )
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"]


def test_size_limit(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    h.runtime.settings.max_upload_bytes = 1000
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


@pytest.mark.modes("real")
def test_csv_and_parquet_with_clipping_and_declared_classes(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    frame = pd.DataFrame(
        {
            "age": [20.0, 35.0, 150.0, 40.0],
            "income": [1.0, -5.0, 3.0, 2.0],
            "y": ["a", "b", "a", "b"],
        }
    )
    meta = {
        "name": "people",
        "label_column": "y",
        "feature_range": {"age": [0, 120], "income": [0, 10]},
        "classes": ["a", "b", "c"],
        "budget": {"epsilon": 2, "delta": 1e-6},
    }
    r = h.upload(owner, _csv(frame), filename="p.csv", metadata=dict(meta))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["clipped_values"] == 2
    assert body["classes"] == ["a", "b", "c"] and body["classes_declared_by_owner"] is True
    assert (body["n_rows"], body["n_features"], body["format"]) == (4, 2, "csv")

    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    r = h.upload(owner, buffer.getvalue(), filename="p.parquet", metadata=dict(meta))
    assert r.status_code == 201, r.text
    assert r.json()["format"] == "parquet"
    rel = h.client.post(
        "/releases",
        json=h.release_body(r.json()["id"], params={"mixture_degree": 2, "n_samples": 5}),
        headers=h.headers(owner),
    )
    assert rel.status_code == 202, rel.text
    done = h.wait(owner, rel.json()["id"])
    assert done["status"] == "succeeded", done
    got = json.loads(str(np.load(io.BytesIO(h.download(owner, done["id"])))["metadata"]))
    assert got["classes"] == ["a", "b", "c"]


@pytest.mark.modes("real")
def test_list_and_get_datasets(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ids = [h.upload(owner, npz_bytes(*toy_dataset(seed=s))).json()["id"] for s in range(2)]
    listed = h.client.get("/datasets", headers=h.headers(owner)).json()["items"]
    assert [d["id"] for d in listed] == ids
    one = h.client.get(f"/datasets/{ids[0]}", headers=h.headers(owner)).json()
    assert one["sha256"] and one["size_bytes"] > 0 and one["budget"]["spent"] == 0.0


def test_s3_debug_logs_never_carry_the_upload_hash(
    real: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    import hashlib
    import logging

    content = npz_bytes(*toy_dataset(seed=11))
    owner, _ = real.new_key("owner")
    with caplog.at_level(logging.DEBUG):
        assert real.upload(owner, content).status_code == 201
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert hashlib.sha256(content).hexdigest() not in text
    assert not any(record.name.startswith("botocore") for record in caplog.records)
