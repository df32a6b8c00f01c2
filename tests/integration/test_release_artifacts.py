"""Releases with further files (ExtraArtifact): stored beside the artifact under the same
upload claim, listed in the release, downloaded in both modes; and the redelivery rules — a
later attempt finishes from the stored files, fails (charged) when one is missing, and never
publishes its own draw over another attempt's."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest

from service.db import transaction
from service.models import LedgerEntry, Release
from service.releases import keys
from service.releases.status import ReleaseStatus
from service.storage import sha256_hex
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import publishing, runner, writing

BODY = {"mechanism": toy.NAME, "epsilon": 1.0}
PARAMS = {"rows": 40, "totals_noise": 20.0, "with_weights": True}


def _release(h: Harness, owner: str, dataset_id: str, **params: Any) -> str:
    body = {**BODY, "dataset_id": dataset_id, "params": {**PARAMS, **params}}
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    release_id: str = r.json()["id"]
    return release_id


def _owner_and_dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    return owner, r.json()["id"]


def _get(h: Harness, key: str, path: str) -> Any:
    return h.client.get(path, headers=h.headers(key), follow_redirects=False)


def test_a_further_file_is_released_beside_the_artifact(toy_harness: Harness) -> None:
    h = toy_harness
    owner, ds = _owner_and_dataset(h)
    analyst, analyst_id = h.new_key("analyst")
    grant = h.client.post(
        f"/datasets/{ds}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text

    toy.GATE.clear()
    rid = _release(h, owner, ds)
    held = h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()
    assert held["status"] in ("queued", "running") and held["artifacts"] == []
    early = _get(h, owner, f"/releases/{rid}/artifacts/{toy.WEIGHTS}")
    assert early.status_code == 409 and early.json()["error"]["code"] == "not_ready"
    toy.GATE.set()
    done = h.wait(owner, rid)
    assert done["status"] == "succeeded", done

    (record,) = done["artifacts"]
    weights = h.download(analyst, rid, toy.WEIGHTS)
    assert record == {
        "name": toy.WEIGHTS,
        "media_type": "application/json",
        "description": "the noisy feature totals (test only)",
        "bytes": len(weights),
        "sha256": sha256_hex(weights),
        "download": f"/releases/{rid}/artifacts/{toy.WEIGHTS}",
    }
    assert h.download(owner, rid, toy.WEIGHTS) == weights
    primary = h.download(analyst, rid)
    assert sha256_hex(primary) == done["artifact"]["sha256"]
    npz = np.load(io.BytesIO(primary))
    # One draw: the further file holds the very totals the NPZ holds.
    assert np.array_equal(np.asarray(json.loads(weights)["totals"]), npz["totals"])
    meta = json.loads(str(npz["metadata"]))
    assert meta["artifacts"] == [{k: record[k] for k in ("name", "media_type", "description")}]
    if h.mode == "embedded":  # the file itself (real mode redirects to the store)
        r = _get(h, owner, f"/releases/{rid}/artifacts/{toy.WEIGHTS}")
        assert r.headers["content-type"].startswith("application/json")
        assert f"release-{rid}-{toy.WEIGHTS}" in r.headers["content-disposition"]

    missing = _get(h, owner, f"/releases/{rid}/artifacts/model.pt")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

    audit = h.client.get(
        "/audit",
        params={"object_type": "release", "object_id": rid},
        headers=h.headers(h.admin_key),
    ).json()["items"]
    (succeeded,) = [e for e in audit if e["action"] == "release.succeeded"]
    assert succeeded["detail"]["artifacts"] == [toy.WEIGHTS]

    # A release without further files lists none, and has none to download.
    plain = _release(h, owner, ds, with_weights=False)
    assert h.wait(owner, plain)["artifacts"] == []
    none = _get(h, owner, f"/releases/{plain}/artifacts/{toy.WEIGHTS}")
    assert none.status_code == 404
    plain_meta = json.loads(str(np.load(io.BytesIO(h.download(owner, plain)))["metadata"]))
    assert "artifacts" not in plain_meta  # metadata of releases without files is unchanged


# -- redelivery (the runner's rules; one mode suffices) ------------------------------------


def _as_if_unrecorded(h: Harness, release_id: str) -> None:
    """The row as an attempt that stored everything and died before recording it left it:
    running, upload claimed (further files declared, not yet sized), charge reserved."""
    with transaction(h.runtime.session_factory) as session:
        release = session.get(Release, release_id)
        assert release is not None and release.artifacts
        release.status, release.artifact_sha256, release.artifact_bytes = (
            ReleaseStatus.running,
            None,
            None,
        )
        release.artifacts = [
            {k: a[k] for k in ("name", "media_type", "description")} for a in release.artifacts
        ]
        entry = session.query(LedgerEntry).filter_by(release_id=release_id).one()
        entry.state, entry.settled_at = "reserved", None


def _draws(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    drawn: list[str] = []
    write_release = writing.write_release

    def counted(runtime: Any, job: Any, *args: Any) -> Any:
        drawn.append(job.release_id)
        return write_release(runtime, job, *args)

    monkeypatch.setattr(writing, "write_release", counted)
    return drawn


def _ledger_states(h: Harness, owner: str, dataset_id: str) -> list[str]:
    ledger = h.client.get(f"/budgets/{dataset_id}", headers=h.headers(owner)).json()
    return [e["state"] for e in ledger["entries"]]


@pytest.mark.parametrize("toy_harness", ["embedded"], indirect=True)
def test_redelivery_finishes_from_the_stored_files(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = toy_harness
    owner, ds = _owner_and_dataset(h)
    rid = _release(h, owner, ds)
    done = h.wait(owner, rid)
    _as_if_unrecorded(h, rid)
    drawn = _draws(monkeypatch)
    runner.execute(h.runtime, rid)
    again = h.wait(owner, rid)
    assert again["status"] == "succeeded" and drawn == []  # no fresh noise
    assert again["artifact"] == done["artifact"] and again["artifacts"] == done["artifacts"]
    assert _ledger_states(h, owner, ds) == ["committed"]


@pytest.mark.parametrize("toy_harness", ["embedded"], indirect=True)
def test_redelivery_missing_a_declared_file_fails_charged(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = toy_harness
    owner, ds = _owner_and_dataset(h)
    rid = _release(h, owner, ds)
    h.wait(owner, rid)
    _as_if_unrecorded(h, rid)
    h.runtime.store.delete(keys.extra_artifact(rid, toy.WEIGHTS))
    drawn = _draws(monkeypatch)
    runner.execute(h.runtime, rid)
    failed = h.wait(owner, rid)
    assert failed["status"] == "failed" and drawn == []
    assert toy.WEIGHTS in failed["error"] and failed["artifacts"] == []
    assert _ledger_states(h, owner, ds) == ["committed"]  # its artifact exists


@pytest.mark.parametrize("toy_harness", ["embedded"], indirect=True)
@pytest.mark.parametrize("other", ["died", "finished"])
def test_a_draw_is_never_published_over_another_attempts(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """Right after this attempt's claim, another attempt (a redelivery beside a worker
    presumed dead) stores its further file first; this attempt then stores nothing of its
    draw. When the other one also stored its artifact, the retry finishes from its files;
    when it died there, bounded attempts end the release failed, charged."""
    h = toy_harness
    owner, ds = _owner_and_dataset(h)
    store = h.runtime.store
    theirs = {"weights": b'{"totals": "the other draw"}', "artifact": b"the other artifact"}
    claim_upload = publishing.claim_upload

    def other_attempt_first(runtime: Any, job: Any, *args: Any) -> bool:
        claimed = claim_upload(runtime, job, *args)
        if not store.exists(keys.extra_artifact(job.release_id, toy.WEIGHTS)):
            store.put(keys.extra_artifact(job.release_id, toy.WEIGHTS), theirs["weights"])
            if other == "finished":
                store.put(job.artifact_key, theirs["artifact"])
        return claimed

    monkeypatch.setattr(publishing, "claim_upload", other_attempt_first)
    monkeypatch.setattr("worker.attempts.time.sleep", lambda _s: None)  # the retries' backoff
    drawn = _draws(monkeypatch)
    rid = _release(h, owner, ds)
    final = h.wait(owner, rid)
    assert drawn == [rid]  # retries never draw again
    assert store.get(keys.extra_artifact(rid, toy.WEIGHTS)) == theirs["weights"]
    if other == "finished":
        assert final["status"] == "succeeded" and final["attempts"] == 2
        assert h.download(owner, rid) == theirs["artifact"]
        assert h.download(owner, rid, toy.WEIGHTS) == theirs["weights"]
        assert final["artifacts"][0]["sha256"] == sha256_hex(theirs["weights"])
    else:
        attempts = h.runtime.settings.task_max_attempts
        assert final["status"] == "failed" and final["attempts"] == attempts
        assert f"gave up after {attempts} attempts" in final["error"]
        assert not store.exists(keys.artifact(rid, "npz"))
    assert _ledger_states(h, owner, ds) == ["committed"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_table_formats_carry_the_metadata_and_arrays_beside_them(
    harness: Harness, fmt: str
) -> None:
    """A CSV release has no place for metadata, and neither table format for a mechanism's
    arrays (random projection's matrix, without which its features cannot be used): they
    travel as further artifacts, the same JSON an NPZ or Parquet release embeds and the same
    array an NPZ release holds (issue 15: before, both were silently dropped)."""
    h = harness
    owner, ds = _owner_and_dataset(h)
    body = {
        "dataset_id": ds,
        "mechanism": "random_projection",
        "params": {"projection_dim": 3},
        "epsilon": 1.0,
        "format": fmt,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    names = {a["name"] for a in done["artifacts"]}
    assert names == ({"metadata.json"} if fmt == "csv" else set()) | {"projection.npy"}

    projection = np.load(io.BytesIO(h.download(owner, done["id"], "projection.npy")))
    assert projection.shape == (3, 6)  # projection_dim × the toy dataset's 6 features
    primary = h.download(owner, done["id"])
    if fmt == "csv":
        meta = json.loads(h.download(owner, done["id"], "metadata.json"))
    else:
        import pyarrow.parquet as pq

        meta = json.loads(pq.read_schema(io.BytesIO(primary)).metadata[b"dprelease"])
    assert meta["release_id"] == done["id"] and meta["mechanism"] == "random_projection"
    assert meta["arrays"] == {"projection": "projection.npy"}
    assert meta["charge"]["epsilon"] == pytest.approx(done["charge"]["epsilon"])
