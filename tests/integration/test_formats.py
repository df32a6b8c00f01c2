"""One release, every format: a release downloads as CSV, Parquet and NPZ, converted from the
stored file on the first download and kept, with its metadata in each and one ledger entry;
conversions are bounded (size, concurrency)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dprelease_client.frames import read_release
from service.releases import conversions, keys
from tests.conftest import Harness
from tests.integration.test_python_client import _visits_table

FORMATS = ("csv", "parquet", "npz")


def _release(h: Harness, owner: str, fmt: str, mechanism: str = "clustmix") -> dict[str, Any]:
    table, columns = _visits_table(np.random.default_rng(0))
    meta = {
        "name": "visits",
        "label_column": "outcome",
        "columns": columns,
        "classes": [0, 1],
        "budget": {"epsilon": 3.0, "delta": 1e-5},
    }
    r = h.upload(owner, table.encode(), filename="visits.csv", metadata=meta)
    assert r.status_code == 201, r.text
    body = h.release_body(r.json()["id"], mechanism=mechanism, params={}, format=fmt)
    body["epsilon"] = 1.0
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"])
    assert done["status"] == "succeeded", done
    return done


def _frame(content: bytes, tmp: Path, name: str, metadata: dict[str, Any] | None) -> pd.DataFrame:
    path = tmp / name
    path.write_bytes(content)
    return read_release(path, metadata)


@pytest.mark.parametrize("own", ["parquet", "csv"])
def test_a_release_downloads_in_every_format_with_one_ledger_entry(
    harness: Harness, tmp_path: Path, own: str
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    done = _release(h, owner, own)
    metadata = json.loads(h.download(owner, done["id"], "metadata.json"))
    assert metadata["mechanism"] == "clustmix" and "table_columns" in metadata["layout"]
    frames = {}
    for fmt in FORMATS:
        content = h.download(owner, done["id"], fmt=fmt)
        frames[fmt] = _frame(
            content, tmp_path, f"release.{fmt}", metadata if fmt == "csv" else None
        )
        if fmt != "csv":  # NPZ and Parquet carry the metadata inside
            assert frames[fmt].attrs["dprelease"] == metadata
    reference = frames[own]
    assert list(reference.columns) == ["site", "visits", "weight", "outcome"]
    for fmt, frame in frames.items():
        pd.testing.assert_frame_equal(frame, reference, check_exact=False, rtol=1e-6, obj=fmt)
    # Converted once, then kept: the stored copy is what later downloads serve.
    other = next(f for f in FORMATS if f != own)
    assert h.runtime.store.exists(keys.converted(done["id"], other))
    assert h.download(owner, done["id"], fmt=other) == h.download(owner, done["id"], fmt=other)
    # The release's own format is its stored file, checksum as declared.
    import hashlib

    own_bytes = h.download(owner, done["id"], fmt=own)
    assert hashlib.sha256(own_bytes).hexdigest() == done["artifact"]["sha256"]
    ledger = h.client.get(f"/budgets/{done['dataset_id']}", headers=h.headers(owner)).json()
    assert [e["release_id"] for e in ledger["entries"]] == [done["id"]]
    assert ledger["spent"] == pytest.approx(done["charge"]["epsilon"])


@pytest.mark.modes("embedded")
def test_public_arrays_travel_into_a_converted_npz(harness: Harness, tmp_path: Path) -> None:
    """Random projection's matrix, a further file beside its Parquet release, is inside the
    NPZ conversion, and the converted metadata says so."""
    h = harness
    owner, _ = h.new_key("owner")
    done = _release(h, owner, "parquet", mechanism="random_projection")
    content = h.download(owner, done["id"], fmt="npz")
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        meta = json.loads(str(npz["metadata"]))
        names = list(meta["arrays"])
        assert names and all(f"{n}.npy" == meta["arrays"][n].split()[0] for n in names)
        for name in names:
            beside = np.load(io.BytesIO(h.download(owner, done["id"], f"{name}.npy")))
            np.testing.assert_array_equal(npz[name], beside)


@pytest.mark.modes("embedded")
def test_conversions_are_bounded_in_size_and_concurrency(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    done = _release(h, owner, "npz")
    small = h.runtime.settings.model_copy(update={"conversion_max_bytes": 100})
    monkeypatch.setattr(h.runtime, "settings", small)
    r = h.client.get(f"/releases/{done['id']}/download?format=csv", headers=h.headers(owner))
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "conversion_too_large"
    assert r.json()["error"]["detail"]["limit_bytes"] == 100
    # Every slot taken: 503 with Retry-After, and nothing stored.
    monkeypatch.setattr(
        h.runtime, "settings", small.model_copy(update={"conversion_max_bytes": 1 << 30})
    )
    monkeypatch.setattr(conversions, "_active", h.runtime.settings.max_concurrent_conversions)
    r = h.client.get(f"/releases/{done['id']}/download?format=csv", headers=h.headers(owner))
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "conversions_busy" and int(r.headers["Retry-After"]) >= 1
    assert not h.runtime.store.exists(keys.converted(done["id"], "csv"))
    r = h.client.get(f"/releases/{done['id']}/download?format=xlsx", headers=h.headers(owner))
    assert r.status_code == 422, r.text
