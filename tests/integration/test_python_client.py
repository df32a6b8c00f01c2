"""The user guide's notebook example (docs/guide.md) with dprelease_client, against the real
app in both modes (downloads: a presigned redirect or the bytes): every typed method, wait()
and to_pandas(); the guide's CSV example in real mode."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from dprelease_client import ApiError, Client
from tests.conftest import Harness, npz_bytes, toy_dataset


@pytest.fixture
def http(harness: Harness) -> Iterator[httpx.Client]:
    """The app at http://testserver; any other origin (the presigned S3 URL a real-mode
    download redirects to) over the network, as a user's client would reach it."""
    app_transport = harness.client._transport
    with httpx.Client(mounts={"http://testserver": app_transport, "all://": None}) as client:
        yield client


def _client(http: httpx.Client, key: str) -> Client:
    return Client(base_url="http://testserver", api_key=key, http=http)


def test_notebook_example_end_to_end(harness: Harness, http: httpx.Client, tmp_path: Path) -> None:
    admin = _client(http, harness.admin_key)
    assert admin.health()["status"] == "ok"
    assert admin.ready()["status"] == "ready"
    created = admin.create_api_key(name="alice", role="owner")
    owner = _client(http, created["key"])
    assert owner.me()["principal_id"] == created["principal_id"]
    assert any(k["id"] == created["key_id"] for k in owner.list_api_keys()["items"])

    data = tmp_path / "toy.npz"
    data.write_bytes(npz_bytes(*toy_dataset()))
    metadata = {
        "name": "toy",
        "feature_range": [0, 13],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 3.0, "delta": 1e-5},
    }
    dataset = owner.upload_file(data, metadata=metadata)
    assert owner.get_dataset(dataset["id"])["n_rows"] == dataset["n_rows"]
    assert [d["id"] for d in owner.list_datasets()["items"]] == [dataset["id"]]
    assert "dpmix" in {m["name"] for m in owner.list_mechanisms()["items"]}

    analyst = admin.create_api_key(name="bob", role="analyst")
    grant = owner.grant(dataset["id"], analyst["principal_id"])
    assert [g["id"] for g in owner.list_grants(dataset["id"])["items"]] == [grant["id"]]

    body = {
        "dataset_id": dataset["id"],
        "mechanism": "dpmix",
        "params": {"mixture_degree": 8, "n_samples": 120},
        "epsilon": 1.0,
        "format": "npz",
    }
    preview = owner.preview_release(body)
    assert preview["budget"]["admissible"] is True
    release = owner.create_release(body)
    seen: list[dict[str, Any]] = []
    final = owner.wait(release["id"], timeout=120, poll=0.05, progress=seen.append)
    assert final["status"] == "succeeded" and seen[-1]["status"] == "succeeded"
    assert [r["id"] for r in owner.list_releases(dataset_id=dataset["id"])["items"]] == [
        release["id"]
    ]

    frame = owner.to_pandas(release["id"])
    assert len(frame) == 120
    # An NPZ upload has no label column: the default name "label"; dpmix gives proportions.
    labels = ["label=0", "label=1", "label=2"]
    assert [c for c in frame.columns if c.startswith("label")] == labels
    assert np.allclose(frame[labels].sum(axis=1), 1.0, atol=1e-5)
    content = owner.download(release["id"])
    assert isinstance(content, bytes)
    assert hashlib.sha256(content).hexdigest() == final["artifact"]["sha256"]
    path = owner.download(release["id"], tmp_path / "out" / "release.npz")
    assert owner.to_pandas(path).equals(frame)

    # The analyst granted sees the release; once the grant is revoked, no longer.
    as_analyst = _client(http, analyst["key"])
    assert as_analyst.get_release(release["id"])["id"] == release["id"]
    owner.revoke_grant(dataset["id"], grant["id"])
    with pytest.raises(ApiError) as caught:
        as_analyst.get_release(release["id"])
    assert caught.value.status == 404

    # dpmix's noisy rows were clipped into the declared bounds: the owner has them as drawn.
    raw = owner.download_raw(release["id"], tmp_path / "raw.npz")
    assert owner.to_pandas(raw.path).shape == frame.shape
    # Typed errors come back as ApiError with the API's code: no report was asked for, a
    # finished release cannot be cancelled.
    with pytest.raises(ApiError) as caught:
        owner.get_report(release["id"])
    assert caught.value.status == 404 and caught.value.code
    with pytest.raises(ApiError) as caught:
        owner.cancel_release(release["id"])
    assert caught.value.status == 409

    ledger = owner.get_budget(dataset["id"])
    assert ledger["spent"] == pytest.approx(1.0)
    assert [b["dataset_id"] for b in owner.list_budgets()["items"]] == [dataset["id"]]
    events = admin.list_audit_events(object_id=release["id"], limit=50)
    assert events["items"]

    assert owner.delete_dataset(dataset["id"])["deleted_at"]
    admin.revoke_api_key(analyst["key_id"])
    with pytest.raises(ApiError) as caught:
        as_analyst.me()
    assert caught.value.status == 401


@pytest.mark.modes("real")
def test_readme_example_csv_to_parquet_dataframe(
    harness: Harness, http: httpx.Client, tmp_path: Path
) -> None:
    """The user guide's "Python client" example: a CSV with a string label column in,
    a Parquet release out as a DataFrame."""
    admin = _client(http, harness.admin_key)
    alice = admin.create_api_key(name="alice", role="owner")
    api = _client(http, alice["key"])
    rows = ["age,hours_per_week,income"]
    rows += [f"{20 + i % 60},{10 + i % 80},{'>50K' if i % 3 else '<=50K'}" for i in range(200)]
    (tmp_path / "adult.csv").write_text("\n".join(rows) + "\n")
    ds = api.upload_file(
        tmp_path / "adult.csv",
        metadata={
            "name": "adult",
            "label_column": "income",
            "feature_range": {"age": [17, 90], "hours_per_week": [1, 99]},
            "classes": ["<=50K", ">50K"],
            "budget": {"epsilon": 3.0, "delta": 1e-5},
        },
    )
    body = {
        "dataset_id": ds["id"],
        "mechanism": "dpmix",
        "params": {"mixture_degree": 8, "n_samples": 50},
        "epsilon": 1.0,
        "format": "parquet",
    }
    assert api.preview_release(body)["budget"]["admissible"] is True
    rel = api.create_release(body)
    api.wait(rel["id"], timeout=120, poll=0.05)
    df = api.to_pandas(rel["id"])
    assert list(df.columns) == ["age", "hours_per_week", "income=<=50K", "income=>50K"]
    assert len(df) == 50


@pytest.mark.modes("embedded")
@pytest.mark.parametrize("fmt", ["csv", "npz"])
def test_to_pandas_gives_the_declared_table_with_its_metadata(
    harness: Harness, http: httpx.Client, tmp_path: Path, fmt: str
) -> None:
    """A release of a table uploaded with declared columns comes back as that table: its
    columns, integer and categorical types, missing entries; the metadata in ``attrs`` (a CSV
    release's fetched from its metadata.json)."""
    admin = _client(http, harness.admin_key)
    api = _client(http, admin.create_api_key(name="owner", role="owner")["key"])
    table, columns = _visits_table(np.random.default_rng(0))
    (tmp_path / "visits.csv").write_text(table)
    ds = api.upload_file(
        tmp_path / "visits.csv",
        metadata={
            "name": "visits",
            "label_column": "outcome",
            "columns": columns,
            "classes": [0, 1],
            "budget": {"epsilon": 3.0, "delta": 1e-5},
        },
    )
    body = {"dataset_id": ds["id"], "mechanism": "clustmix", "epsilon": 1.0, "format": fmt}
    rel = api.create_release(body)
    api.wait(rel["id"], timeout=120, poll=0.05)
    df = api.to_pandas(rel["id"])
    assert list(df.columns) == ["site", "visits", "weight", "outcome"]
    assert len(df) == 300
    assert list(df["site"].cat.categories) == ["A", "B", "C"]
    assert str(df["visits"].dtype) == "Int64"
    assert df["visits"].dropna().between(0, 20).all()
    assert df["weight"].between(40, 120).all()
    assert set(df["outcome"]) <= {0, 1}
    assert df.attrs["dprelease"]["mechanism"] == "clustmix"
    assert [c["name"] for c in df.attrs["dprelease"]["layout"]["table_columns"]] == [
        "site",
        "visits",
        "weight",
    ]
    # The same release in another format, converted by the server: the same table.
    other = api.to_pandas(rel["id"], format="parquet" if fmt == "csv" else "csv")
    pd.testing.assert_frame_equal(other, df, check_exact=False, rtol=1e-6)
    assert other.attrs["dprelease"] == df.attrs["dprelease"]


def _visits_table(rng: np.random.Generator) -> tuple[str, list[dict[str, Any]]]:
    """A 300-row CSV (a categorical site, an integer visit count with gaps, a weight, a
    0/1 outcome) and its column declaration."""
    rows = ["site,visits,weight,outcome"]
    for i in range(300):
        visits = "" if i % 7 == 0 else str(int(rng.integers(0, 20)))
        rows.append(f"{'AB'[i % 2]},{visits},{rng.uniform(40, 120):.1f},{i % 3 == 0:d}")
    columns: list[dict[str, Any]] = [
        {"name": "site", "type": "categorical", "categories": ["A", "B", "C"]},
        {
            "name": "visits",
            "type": "numeric",
            "bounds": [0, 20],
            "integer": True,
            "missing": {"policy": "indicator"},
        },
        {"name": "weight", "type": "numeric", "bounds": [40, 120]},
    ]
    return "\n".join(rows) + "\n", columns
