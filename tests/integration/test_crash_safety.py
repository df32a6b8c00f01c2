"""Crash safety in real mode (Postgres, Redis, moto S3): release jobs whose Celery worker is
SIGKILLed at each phase, then redelivered (by a fresh worker after the visibility timeout, or
by the same worker at once when only its pool child died).

Whatever the phase: one ledger entry, committed exactly once (or refunded when the job died
before it began reading the dataset: docs/privacy.md, "Failures and cancellations"), at most
one artifact, never an artifact without a committed charge, a
terminal state within the bounded attempts, and a stored artifact is never replaced by one
with fresh noise."""

from __future__ import annotations

import io
import json
import select
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import select as sql_select

from service.app import create_app
from service.models import LedgerEntry, Release
from service.releases import keys
from service.runtime import Route, Runtime, build_runtime
from service.storage import S3ObjectStore, sha256_hex
from tests.conftest import ADMIN_KEY, Harness, npz_bytes, toy_dataset
from tests.integration.crash_worker import PHASES
from tests.integration.servers import ROOT, private_redis, settings_env, stop
from worker import runner, writing
from worker.celery_app import RUN_RELEASE

pytestmark = pytest.mark.slow  # kills Celery workers at every phase

# Seconds before Redis hands a job that is still unacknowledged to another worker. Long enough
# that a live attempt on a busy machine (the CI box runs the suite on 2 cores) is never handed
# out again while it runs: at 3 s, loaded runs saw one release attempted twice at once (noise
# drawn twice, crash counts off). The solo-pool tests wait for it once each.
VISIBILITY_TIMEOUT = 10


class PrivateQueue:
    """The API's dispatcher for these tests: jobs go to a queue of the private Redis."""

    def __init__(self, broker: str) -> None:
        self.app = Celery("crash-test", broker=broker)
        self.app.conf.task_serializer = "json"
        self.queue = "unset"

    def enqueue(self, release_id: str, queue: Route) -> None:
        # Every job (DPMix: the CPU pool) goes to the one private queue the spawned workers read.
        self.app.send_task(RUN_RELEASE, args=[release_id], queue=self.queue)

    def shutdown(self) -> None:
        pass


@dataclass
class Crash:
    harness: Harness
    runtime: Runtime
    dispatcher: PrivateQueue
    broker: str
    plan_dir: Path
    server: subprocess.Popen[str]
    log: Path

    def ask(self, line: str, timeout: float = 120) -> str:
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.write(line + "\n")
        self.server.stdin.flush()
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        assert ready, f"worker fork server did not answer {line!r}:\n{self.log_tail()}"
        return self.server.stdout.readline().strip()

    def spawn(self, queue: str, pool: str = "solo") -> int:
        answer = self.ask(f"spawn {queue} {pool}")
        assert answer.startswith("pid "), answer
        return int(answer.split()[1])

    def wait(self, pid: int, seconds: float) -> str:
        return self.ask(f"wait {pid} {seconds}", timeout=seconds + 30)

    def log_tail(self) -> str:
        return self.log.read_text()[-4000:]

    def events(self, release_id: str) -> Counter[str]:
        path = self.plan_dir / "events"
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter(line.split()[1] for line in lines if line.startswith(release_id))

    def plan(self, release_id: str, phase: str, times: int) -> None:
        (self.plan_dir / release_id).write_text(f"{phase} {times}")

    def objects(self, release_id: str) -> dict[str, bytes]:
        store = self.runtime.store
        assert isinstance(store, S3ObjectStore)
        listing = store.client.list_objects_v2(
            Bucket=store.bucket, Prefix=f"releases/{release_id}/"
        )
        return {
            o["Key"].rsplit("/", 1)[1]: store.get(o["Key"]) for o in listing.get("Contents", [])
        }

    def row(self, release_id: str) -> tuple[Release, list[LedgerEntry]]:
        with self.runtime.session_factory() as session:
            release = session.get(Release, release_id)
            assert release is not None
            stmt = sql_select(LedgerEntry).where(LedgerEntry.release_id == release_id)
            return release, list(session.scalars(stmt))

    def wait_terminal(self, release_ids: list[str], seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while True:
            states = {rid: self.row(rid)[0].status for rid in release_ids}
            if all(s in ("succeeded", "failed") for s in states.values()):
                return
            assert time.monotonic() < deadline, f"{states}\n{self.log_tail()}"
            time.sleep(0.2)

    def queue_drained(self, queue: str) -> bool:
        client = redis.Redis.from_url(self.broker)
        try:
            return client.llen(queue) == 0 and client.hlen("unacked") == 0
        finally:
            client.close()


@pytest.fixture(scope="module")
def crash(
    real_services: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Crash]:
    base = tmp_path_factory.mktemp("crash")
    with private_redis(base / "redis") as broker:
        settings = real_services["settings"].model_copy(
            update={
                "celery_broker_url": broker,
                "celery_visibility_timeout": VISIBILITY_TIMEOUT,
                # Releases of more rows are sharded (the releases above make 40 rows).
                "shard_rows": SHARD_ROWS,
            }
        )
        plan_dir = base / "plan"
        plan_dir.mkdir()
        log = base / "workers.log"
        with log.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.crash_worker", str(plan_dir)],
                env=settings_env(settings),
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        dispatcher = PrivateQueue(broker)
        runtime = build_runtime(settings, lambda _runtime: dispatcher)
        try:
            with TestClient(create_app(runtime=runtime)) as client:
                harness = Harness("crash", client, runtime, ADMIN_KEY)
                yield Crash(harness, runtime, dispatcher, broker, plan_dir, server, log)
        finally:
            if server.stdin is not None:
                server.stdin.close()
            stop(server)
            runtime.engine.dispose()


# Rows per shard of test_a_shard_dying_is_drawn_again's release.
SHARD_ROWS = 500

# The release these tests crash: post-processed (opt-in), so it stores the owner's raw rows too
# and every phase of the worker's path is crossed.
PARAMS = {"mixture_degree": 4, "n_samples": 40, "postprocess": "denoise"}
# What a succeeded such release stores.
STORED = {"release.npz", "raw.npz", "metadata.json"}


def _releases(crash: Crash, queue: str, plans: list[tuple[str, int]]) -> list[str]:
    """One small DPMix release per (phase, times), queued on ``queue``, with its crash plan."""
    h = crash.harness
    crash.dispatcher.queue = queue
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=60, d=4)), budget={"epsilon": 20.0, "delta": 1e-5}
    ).json()
    ids = []
    for phase, times in plans:
        body = h.release_body(ds["id"], params=PARAMS)
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
        crash.plan(ids[-1], phase, times)
    return ids


def test_worker_killed_at_each_phase(crash: Crash) -> None:
    """One release per phase, each on its own solo worker that dies there (SIGKILL, whole
    worker); after the visibility timeout one fresh worker finishes them all."""
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    ids = dict(zip(PHASES, _releases(crash, queue, [(p, 1) for p in PHASES]), strict=True))
    workers = [crash.spawn(queue) for _ in PHASES]
    for pid in workers:
        assert crash.wait(pid, 90) == "status -9", crash.log_tail()
    for phase, rid in ids.items():
        assert crash.events(rid)[f"crash:{phase}"] == 1, (phase, crash.events(rid))

    # What each death left behind.
    first_sha = {}
    for phase, rid in ids.items():
        release, entries = crash.row(rid)
        stored = crash.objects(rid)
        assert len(entries) == 1
        if phase == "after_commit":
            assert release.status == "succeeded" and entries[0].state == "committed"
        else:
            assert release.status == "running" and release.attempts == 1
            assert entries[0].state == "reserved"
        if phase in ("before_noise", "after_noise", "after_claim"):
            assert stored == {}, phase
        else:
            assert set(stored) == STORED, phase
            first_sha[phase] = sha256_hex(stored["release.npz"])
        assert (release.artifact_key is not None) == (phase not in PHASES[:2])  # the claim

    # A fresh worker at once: it takes each job back once its visibility timeout has passed
    # (it looks every second: tests/integration/crash_worker.py), not before.
    fresh = crash.spawn(queue)
    crash.wait_terminal(list(ids.values()))
    assert crash.ask(f"stop {fresh}") == "status 0"
    assert crash.queue_drained(queue)  # every delivery acknowledged, none lost

    outcomes = {}
    for phase, rid in ids.items():
        release, entries = crash.row(rid)
        stored = crash.objects(rid)
        events = crash.events(rid)
        outcomes[phase] = (
            release.status,
            release.attempts,
            entries[0].state,
            events["after_noise"],
        )
        assert release.status == "succeeded", (phase, release.error)
        assert [e.state for e in entries] == ["committed"]
        assert set(stored) == STORED
        sha = sha256_hex(stored["release.npz"])
        assert release.artifact_sha256 == sha
        assert sha256_hex(crash.harness.download(ADMIN_KEY, rid)) == sha  # what is served
        if phase in first_sha:  # stored before the crash: finished from it, no fresh noise
            assert sha == first_sha[phase]
            assert events["after_noise"] == 1
        # Noise is drawn again only when the first draw was never stored.
        expected_draws = {"before_noise": 1, "after_noise": 2, "after_claim": 2}
        assert events["after_noise"] == expected_draws.get(phase, 1), (phase, events)
        assert release.attempts == (1 if phase == "after_commit" else 2)
    print("crash outcomes (status, attempts, ledger, noise draws):", outcomes)


def test_every_attempt_killed_ends_failed(crash: Crash) -> None:
    """Pool children killed on every attempt (the worker survives and Celery requeues the job
    at once, reject_on_worker_lost): bounded attempts, then failed. Refunded when every death
    came before the job read the dataset; charged on recovery when it came after the read
    (before any noise, or with the artifact stored)."""
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    before_read, before_noise, after_upload = _releases(
        crash, queue, [("before_read", 99), ("before_noise", 99), ("after_upload", 99)]
    )
    workers = [crash.spawn(queue, "prefork") for _ in range(2)]
    crash.wait_terminal([before_read, before_noise, after_upload])
    for worker in workers:
        assert crash.wait(worker, 0) == "alive"  # only their pool children died
        assert crash.ask(f"stop {worker}") == "status 0"
    assert crash.queue_drained(queue)
    attempts = crash.harness.runtime.settings.task_max_attempts

    release, entries = crash.row(before_read)
    assert release.status == "failed" and f"gave up after {attempts} attempts" in (
        release.error or ""
    )
    assert release.attempts == attempts and release.private_read_at is None
    assert [(e.state, e.settled_because) for e in entries] == [("refunded", "before_private_read")]
    assert crash.objects(before_read) == {}
    assert crash.events(before_read)["crash:before_read"] == attempts

    release, entries = crash.row(before_noise)
    assert release.status == "failed" and f"gave up after {attempts} attempts" in (
        release.error or ""
    )
    assert release.attempts == attempts and release.private_read_at is not None
    # Died after it began reading the data: whether it dies may depend on the data.
    assert [(e.state, e.settled_because) for e in entries] == [("committed", "private_data_read")]
    assert crash.objects(before_noise) == {}
    assert crash.events(before_noise)["crash:before_noise"] == attempts

    release, entries = crash.row(after_upload)
    assert release.status == "failed" and release.attempts == attempts
    assert [e.state for e in entries] == ["committed"]  # its output exists: it stays charged
    assert set(crash.objects(after_upload)) == STORED
    assert crash.events(after_upload)["after_noise"] == 1  # retries finished from the store
    assert crash.events(after_upload)["crash:after_upload"] == attempts
    print(
        "every attempt killed:",
        {
            "before_read": ("failed", "refunded"),
            "before_noise": ("failed", "committed"),
            "after_upload": ("failed", "committed"),
        },
    )


def test_a_shard_dying_is_drawn_again(crash: Crash) -> None:
    """A sharded release (3 shards on the CPU queue, where its shard tasks go): its first
    worker stores shard 0 and dies with shard 1 drawn but not stored; after the visibility
    timeout a fresh worker draws shard 1 again (nothing of the first draw was stored), draws
    shard 2, assembles and settles the release: one charge, one attempt, one file, parts
    gone."""
    queue = crash.runtime.settings.cpu_queue
    crash.dispatcher.queue = queue
    h = crash.harness
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=60, d=4)), budget={"epsilon": 20.0, "delta": 1e-5}
    ).json()
    body = h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 3 * SHARD_ROWS})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    crash.plan(rid, "shard_1_drawn", 1)

    first = crash.spawn(queue)
    assert crash.wait(first, 90) == "status -9", crash.log_tail()
    release, entries = crash.row(rid)
    assert release.status == "running" and [e.state for e in entries] == ["reserved"]
    assert release.artifact_key is not None  # shard 0 claimed the upload before storing
    assert set(crash.objects(rid)) == {
        "part-00000.npz",
        "part-00000.npz.try-1",
        "part-00001.npz.try-1",
    }

    fresh = crash.spawn(queue)  # takes the job back after its visibility timeout
    crash.wait_terminal([rid])
    assert crash.ask(f"stop {fresh}") == "status 0"
    assert crash.queue_drained(queue)

    release, entries = crash.row(rid)
    events = crash.events(rid)
    assert release.status == "succeeded", release.error
    assert release.attempts == 1
    assert [e.state for e in entries] == ["committed"]
    assert events["shard_0_drawn"] == 1 and events["shard_2_drawn"] == 1
    assert events["shard_1_drawn"] == 2 and events["crash:shard_1_drawn"] == 1
    stored = crash.objects(rid)
    # The parts are gone; the owner's copy of the rows as drawn stays (clipped in the release).
    assert set(stored) == {"release.npz", "raw.npz", "metadata.json"}
    with np.load(io.BytesIO(crash.harness.download(ADMIN_KEY, rid)), allow_pickle=False) as z:
        assert z["X"].shape == (3 * SHARD_ROWS, 4)
        assert json.loads(bytes(z["metadata"]))["shards"]["count"] == 3
    # No shard twice: the rows as drawn are all distinct (clipping merges some in the release).
    with np.load(io.BytesIO(stored["raw.npz"]), allow_pickle=False) as z:
        assert len(np.unique(z["X"], axis=0)) == 3 * SHARD_ROWS


def _one_release(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset(n=60, d=4))).json()
    body = h.release_body(ds["id"], params=PARAMS)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    return owner, r.json()["id"]


def test_release_settled_meanwhile_is_never_published(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second delivery gives up while the first has drawn its noise: the first must not
    store its output afterwards (a settled release stores nothing). Its job had read the data,
    so the charge stands (it would stand had the claim come first, too)."""
    h = embedded
    write_release = writing.write_release

    def other_delivery_gives_up(runtime: Runtime, job: Any, *args: Any) -> Any:
        meta = write_release(runtime, job, *args)
        runner.fail(runtime, job.release_id, "another delivery gave up")
        return meta

    monkeypatch.setattr(writing, "write_release", other_delivery_gives_up)
    owner, rid = _one_release(h)
    done = h.wait(owner, rid)
    assert done["status"] == "failed" and done["artifact"] is None
    assert not h.runtime.store.exists(keys.artifact(rid, "npz"))
    ledger = h.client.get(f"/budgets/{done['dataset_id']}", headers=h.headers(owner)).json()
    assert [(e["state"], e["settled_because"]) for e in ledger["entries"]] == [
        ("committed", "private_data_read")
    ]


def test_claimed_upload_stays_charged(embedded: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second delivery gives up after the first claimed the upload (and before its bytes
    land): the charge is committed, since the output may exist."""
    h = embedded
    put_file = h.runtime.store.put_file

    def other_delivery_gives_up(key: str, path: Path) -> None:
        release_id = key.split("/")[1]
        runner.fail(h.runtime, release_id, "another delivery gave up")
        put_file(key, path)

    monkeypatch.setattr(h.runtime.store, "put_file", other_delivery_gives_up)
    owner, rid = _one_release(h)
    done = h.wait(owner, rid)
    assert done["status"] == "failed"
    # The status reads failed before the claimed upload's bytes land: wait for the upload.
    deadline = time.monotonic() + 60
    while not h.runtime.store.exists(keys.artifact(rid, "npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.runtime.store.exists(keys.artifact(rid, "npz"))
    ledger = h.client.get(f"/budgets/{done['dataset_id']}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["committed"]
