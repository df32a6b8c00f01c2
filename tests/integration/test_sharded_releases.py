"""Sharded releases through the service (issue 16, item 3), in both modes: embedded (the
coordinator draws the shards itself) and real (Celery: one task per shard, then the
finaliser). One release, one charge, one file of the unsharded release's rows; its parts are
gone once it is settled. The law is pinned in tests/unit/test_sharding.py; the crash of a
shard in tests/integration/test_crash_safety.py."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from service.models import LedgerEntry
from service.releases import keys
from service.storage import LocalObjectStore, S3ObjectStore
from tests.conftest import Harness, npz_bytes, toy_dataset

SHARD_ROWS = 400


@pytest.fixture
def sharding(
    harness: Harness, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Harness:
    """``harness`` whose job runner splits releases of more than SHARD_ROWS rows (in real
    mode the session's Celery worker runs the jobs: its settings are the ones that count)."""
    runtimes = [harness.runtime]
    if harness.mode == "real":
        runtimes.append(request.getfixturevalue("real_services")["worker_runtime"])
    for runtime in runtimes:
        monkeypatch.setattr(
            runtime, "settings", runtime.settings.model_copy(update={"shard_rows": SHARD_ROWS})
        )
    return harness


def _stored_keys(h: Harness, release_id: str) -> set[str]:
    store = h.runtime.store
    prefix = keys.prefix(release_id)
    if isinstance(store, LocalObjectStore):
        root = store.local_path(prefix.rstrip("/"))
        assert root is not None
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert isinstance(store, S3ObjectStore)
    listing = store.client.list_objects_v2(Bucket=store.bucket, Prefix=prefix)
    return {o["Key"][len(prefix) :] for o in listing.get("Contents", [])}


def _ledger(h: Harness, release_id: str) -> list[LedgerEntry]:
    with h.runtime.session_factory() as session:
        return list(
            session.scalars(select(LedgerEntry).where(LedgerEntry.release_id == release_id))
        )


# Sharding and the Dask engine run DP-CDA with declared class sizes (DP class sizes are drawn
# once per release, in the build: such a release runs whole and locally).
DPCDA = {"mixture_degree": 4, "min_class_size": 20, "class_sizes": "declared"}


def _release(
    h: Harness, owner: str, dataset_id: str, mechanism: str, params: dict[str, Any]
) -> dict[str, Any]:
    body = h.release_body(dataset_id, mechanism=mechanism, params=params, epsilon=1.0)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    return done


@pytest.mark.parametrize(
    ("mechanism", "params", "rows", "count"),
    [
        # Post-processed: the finaliser fits the denoiser on every shard's rows.
        ("dpmix", {"mixture_degree": 4, "n_samples": 1000, "postprocess": "denoise"}, 1000, 3),
        # ⌈1000/3⌉ = 334 rows per class, as unsharded: shards of whole classes.
        ("dpcda", {**DPCDA, "n_samples": 1000}, 1002, 3),
        ("sgdrm", {"mixture_width": 4, "n_samples": 900}, 900, 3),
    ],
)
def test_a_sharded_release_is_one_file_one_charge(
    sharding: Harness, mechanism: str, params: dict[str, Any], rows: int, count: int
) -> None:
    h = sharding
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=300, d=4)), budget={"epsilon": 10.0, "delta": 1e-5}
    ).json()
    done = _release(h, owner, ds["id"], mechanism, params)
    rid = done["id"]
    assert done["progress"] == 1.0

    with np.load(io.BytesIO(h.download(owner, rid)), allow_pickle=False) as z:
        X, y, meta = z["X"], z["y"], json.loads(bytes(z["metadata"]))
    drawn = h.as_drawn(owner, rid)
    if drawn is not None:  # post-processed or clipped into the domain: count repeats as drawn
        with np.load(io.BytesIO(drawn), allow_pickle=False) as z:
            X = z["X"]
    assert X.shape == (rows, 4) and y.shape == (rows, 3)
    assert np.isfinite(X).all()
    # No shard repeated: a repeat would duplicate ≥ 300 rows. A few exact float32 collisions
    # happen after denoising, which can keep one direction per class (a line, at d = 4).
    assert len(np.unique(X, axis=0)) >= rows - rows // 100
    assert meta["shards"]["count"] == count and sum(meta["shards"]["rows"]) == rows
    assert meta["params"]["n_samples"] == params["n_samples"]  # the release's, not a shard's

    # Charged once, for the whole release.
    entries = _ledger(h, rid)
    assert [e.state for e in entries] == ["committed"]
    assert entries[0].epsilon == pytest.approx(1.0)
    budgets = h.client.get("/budgets", headers=h.headers(owner)).json()["items"]
    mine = [b for b in budgets if b["dataset_id"] == ds["id"]]
    assert mine[0]["spent"] == pytest.approx(1.0) and mine[0]["release_count"] == 1
    # The parts go once the release has settled (the worker deletes them after the success
    # commits, which the status above may already show); what stays is what an unsharded
    # release stores.
    deadline = time.monotonic() + 30
    stored = _stored_keys(h, rid)
    while any(k.startswith("shards/") for k in stored):
        assert time.monotonic() < deadline, stored
        time.sleep(0.05)
        stored = _stored_keys(h, rid)
    assert "release.npz" in stored


@pytest.mark.modes("real")
def test_record_assignment_runs_whole(sharding: Harness) -> None:
    """A configuration whose rows are not independent draws is never split."""
    h = sharding
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=300, d=4)), budget={"epsilon": 10.0, "delta": 1e-5}
    ).json()
    params = {"mixture_degree": 4, "n_samples": 1000, "assignment": "record"}
    rid = _release(h, owner, ds["id"], "dpmix", params)["id"]
    with np.load(io.BytesIO(h.download(owner, rid)), allow_pickle=False) as z:
        assert "shards" not in json.loads(bytes(z["metadata"])) and len(z["X"]) == 1000


def test_a_cancelled_sharded_release_stores_nothing_more(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after its first shard stored a part: charged its whole ε (its job read the
    data, and output may exist), as the release said before the cancel (``if_cancelled``);
    no further part, no artifact, and the stored part removed."""
    from worker import production

    h = embedded
    monkeypatch.setattr(
        h.runtime, "settings", h.runtime.settings.model_copy(update={"shard_rows": SHARD_ROWS})
    )
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=300, d=4)), budget={"epsilon": 10.0, "delta": 1e-5}
    ).json()
    draw = production.draw_shard
    seen: list[int] = []
    answers: list[dict[str, Any]] = []

    def cancel_after_first(
        runtime: Any, job: Any, parsed: Any, plan: Any, index: int, done: int
    ) -> None:
        draw(runtime, job, parsed, plan, index, done)
        seen.append(index)
        if len(seen) == 1:
            path = f"/releases/{job.release_id}"
            before = h.client.get(path, headers=h.headers(owner)).json()
            assert before["progress"] < 1.0 and before["if_cancelled"] == "committed"
            r = h.client.post(f"{path}/cancel", headers=h.headers(owner))
            assert r.status_code in (200, 202), r.text
            answers.append(r.json())

    monkeypatch.setattr(production, "draw_shard", cancel_after_first)
    body = h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 1000})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    done = h.wait(owner, rid)
    assert done["status"] == "cancelled" and seen == [0]
    assert [e.state for e in _ledger(h, rid)] == ["committed"]  # a part was stored: charged
    assert _ledger(h, rid)[0].epsilon == pytest.approx(1.0)  # the whole ε, at 1 shard of 3
    assert answers[0]["settlement"] == {"state": "committed", "because": "upload_claimed"}
    # The job removes the part once it sees the cancel, which may be after the status reads
    # "cancelled": wait for the job's end, not for the status.
    deadline = time.monotonic() + 60
    while _stored_keys(h, rid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _stored_keys(h, rid) == set()


def test_a_release_the_dask_engine_runs_is_not_sharded(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DP-CDA (declared class sizes) is both shardable and distributable: under the Dask
    engine it runs there, whole; a DPMix mixture-assignment release (no Dask job) is still
    sharded."""
    h = embedded
    update = {
        "shard_rows": SHARD_ROWS,
        "release_engine": "dask",
        "dask_local_processes": False,
        "dask_local_workers": 2,
    }
    monkeypatch.setattr(h.runtime, "settings", h.runtime.settings.model_copy(update=update))
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=300, d=4)), budget={"epsilon": 10.0, "delta": 1e-5}
    ).json()
    cases = [
        ("dpcda", {**DPCDA, "n_samples": 1000}, "dask", None),
        ("dpmix", {"mixture_degree": 4, "n_samples": 1000}, "local", 3),
    ]
    for mechanism, params, engine, count in cases:
        rid = _release(h, owner, ds["id"], mechanism, params)["id"]
        with np.load(io.BytesIO(h.download(owner, rid)), allow_pickle=False) as z:
            meta = json.loads(bytes(z["metadata"]))
        assert meta["engine"] == engine, mechanism
        assert meta.get("shards", {}).get("count") == count, mechanism
        assert [e.state for e in _ledger(h, rid)] == ["committed"]
