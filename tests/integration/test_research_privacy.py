"""Research releases stay with their owner: an admin and a granted analyst see nothing of one
(existence, id, parameters, size, rows, times) through any endpoint, the ledger, the audit
trail, /metrics or the process logs. Each test runs an ordinary release beside the research
one, which the same channel does show: a channel that went dark would fail the test."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from service import owner_only
from tests.conftest import Harness, npz_bytes, toy_dataset

BUDGET = {"epsilon": 50.0, "delta": 1e-5}


@dataclass
class Scene:
    owner: str
    analyst: str
    dataset_id: str
    ordinary: dict[str, Any]
    research: dict[str, Any] | None = None


def _body(dataset_id: str, *, research: bool) -> dict[str, Any]:
    # local_perturbation: the quickest job; its paper accountant is not a bound (research).
    return {
        "dataset_id": dataset_id,
        "mechanism": "local_perturbation",
        "params": {},
        "epsilon": 8.0,
        "accountant": "paper" if research else "tight",
        "research": research,
    }


def _scene(h: Harness) -> Scene:
    """A dataset granted to an analyst, with one ordinary release, succeeded."""
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    r = h.upload(owner, npz_bytes(*toy_dataset(n=200)), budget=BUDGET)
    assert r.status_code == 201, r.text
    dataset_id = r.json()["id"]
    r = h.client.post(
        f"/datasets/{dataset_id}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    assert r.status_code == 201, r.text
    r = h.client.post("/releases", json=_body(dataset_id, research=False), headers=h.headers(owner))
    assert r.status_code == 202, r.text
    ordinary = h.wait(owner, r.json()["id"])
    assert ordinary["status"] == "succeeded", ordinary
    return Scene(owner, analyst, dataset_id, ordinary)


def _research(h: Harness, scene: Scene) -> dict[str, Any]:
    """The owner's whole research lifecycle: preview, create, follow, list, read its ledger,
    download. Returns the release, succeeded."""
    owner = h.headers(scene.owner)
    body = _body(scene.dataset_id, research=True)
    assert h.client.post("/releases/preview", json=body, headers=owner).status_code == 200
    r = h.client.post("/releases", json=body, headers=owner)
    assert r.status_code == 202, r.text
    done = h.wait(scene.owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    listed = h.client.get("/releases", headers=owner).json()["items"]
    assert done["id"] in {x["id"] for x in listed}
    ledger = h.client.get(f"/budgets/{scene.dataset_id}", headers=owner).json()
    assert done["id"] in {e["release_id"] for e in ledger["entries"]}
    assert h.download(scene.owner, done["id"])
    scene.research = done
    return done


def _missing(h: Harness, key: str, path: str) -> tuple[int, str]:
    """Status and error code of ``path`` with a made-up release id in place of the real one."""
    r = h.client.get(path, headers=h.headers(key))
    return r.status_code, r.json()["error"]["code"]


def test_releases_endpoints_show_no_research_release(harness: Harness) -> None:
    h = harness
    scene = _scene(h)
    rid = _research(h, scene)["id"]
    fake = uuid.uuid4().hex
    for key in (scene.analyst, h.admin_key):
        listed = h.client.get("/releases", headers=h.headers(key))
        assert scene.ordinary["id"] in listed.text and rid not in listed.text
        by_dataset = h.client.get(
            "/releases", params={"dataset_id": scene.dataset_id}, headers=h.headers(key)
        )
        assert scene.ordinary["id"] in by_dataset.text and rid not in by_dataset.text
        for suffix in ("", "/download", "/summary", "/artifacts/x", "/raw", "/report"):
            r = h.client.get(f"/releases/{rid}{suffix}", headers=h.headers(key))
            # Exactly a missing id's answer: nothing tells that this one exists.
            assert (r.status_code, r.json()["error"]["code"]) == _missing(
                h, key, f"/releases/{fake}{suffix}"
            ), (key, suffix)
            assert (
                r.json()["error"]["message"].replace(rid, fake)
                == h.client.get(f"/releases/{fake}{suffix}", headers=h.headers(key)).json()[
                    "error"
                ]["message"]
            )
        # Cancelling is the owner's: refused by role before any lookup, for any id alike.
        cancel = h.client.post(f"/releases/{rid}/cancel", headers=h.headers(key))
        other = h.client.post(f"/releases/{fake}/cancel", headers=h.headers(key))
        assert cancel.status_code == other.status_code == 403


def _budget_item(h: Harness, dataset_id: str) -> dict[str, Any]:
    """The admin's GET /budgets line of one dataset (release_count included)."""
    items = h.client.get("/budgets", headers=h.headers(h.admin_key)).json()["items"]
    (item,) = [i for i in items if i["dataset_id"] == dataset_id]
    return item  # type: ignore[no-any-return]


def test_ledger_views_omit_research_entries_for_admins(harness: Harness) -> None:
    h = harness
    scene = _scene(h)
    admin = h.headers(h.admin_key)
    before_ledger = h.client.get(f"/budgets/{scene.dataset_id}", headers=admin).json()
    before_list = _budget_item(h, scene.dataset_id)
    rid = _research(h, scene)["id"]

    ledger = h.client.get(f"/budgets/{scene.dataset_id}", headers=admin)
    assert ledger.status_code == 200 and rid not in ledger.text
    # The admin's ledger is the one it saw before the research release, figure for figure:
    # research entries are free and never held, so leaving them out changes no running total.
    assert ledger.json() == before_ledger
    assert [e["release_id"] for e in ledger.json()["entries"]] == [scene.ordinary["id"]]
    assert _budget_item(h, scene.dataset_id) == before_list
    # The owner's ledger lists it, at zero cost, with the same figures for the rest.
    own = h.client.get(f"/budgets/{scene.dataset_id}", headers=h.headers(scene.owner)).json()
    assert [e["release_id"] for e in own["entries"]] == [scene.ordinary["id"], rid]
    assert own["entries"][0] == ledger.json()["entries"][0]
    assert {k: v for k, v in own.items() if k != "entries"} == {
        k: v for k, v in ledger.json().items() if k != "entries"
    }
    # Analysts have no ledger at all (role), for this dataset as for any.
    r = h.client.get(f"/budgets/{scene.dataset_id}", headers=h.headers(scene.analyst))
    assert r.status_code == 403


def test_the_audit_trail_records_nothing_of_a_research_release(harness: Harness) -> None:
    h = harness
    scene = _scene(h)
    rid = _research(h, scene)["id"]
    # Cancelling a research release is its owner's business too: a queued one, cancelled.
    r = h.client.post(
        "/releases", json=_body(scene.dataset_id, research=True), headers=h.headers(scene.owner)
    )
    cancelled = r.json()["id"]
    h.client.post(f"/releases/{cancelled}/cancel", headers=h.headers(scene.owner))
    h.wait(scene.owner, cancelled)

    events: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = h.client.get("/audit", params=params, headers=h.headers(h.admin_key)).json()
        events += page["items"]
        if not (cursor := page["next_cursor"]):
            break
    text = repr(events)
    assert rid not in text and cancelled not in text
    # The ordinary release is audited as ever (what the console's audit CSV is made of).
    ordinary = [e["action"] for e in events if e["object_id"] == scene.ordinary["id"]]
    assert ordinary == ["release.admitted", "release.running", "release.succeeded"]
    # Nothing on the dataset either, but its creation and grant.
    on_dataset = [
        e["action"]
        for e in events
        if e["object_id"] == scene.dataset_id or e["detail"].get("dataset_id") == scene.dataset_id
    ]
    assert sorted(on_dataset) == sorted(
        ["dataset.created", "grant.created", *ordinary],
    )
    for event in events:
        assert "research" not in repr(event["detail"])


_RELEASES = "dprelease_releases{"
_JOBS = 'mechanism="local_perturbation"'


def _samples(h: Harness) -> dict[str, float]:
    """What this test's releases can move in /metrics: every request sample but the scrapes'
    own, local_perturbation's job durations, and the number of releases (all statuses
    together: in real mode an earlier test's release may change status meanwhile, never
    appear)."""
    r = h.client.get("/metrics", headers=h.headers(h.admin_key))
    assert r.status_code == 200, r.text
    out = {_RELEASES: 0.0}
    for line in r.text.splitlines():
        if line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        if series.split("{", 1)[0].endswith("_created") or 'route="/metrics"' in series:
            continue
        if series.startswith("dprelease_http_request") or (
            series.startswith("dprelease_job_duration") and _JOBS in series
        ):
            out[series] = float(value)
        elif series.startswith(_RELEASES):
            out[_RELEASES] += float(value)
    return out


def test_metrics_show_nothing_of_a_research_release(harness: Harness) -> None:
    h = harness
    scene = _scene(h)
    before = _samples(h)
    _research(h, scene)
    after = _samples(h)
    # The owner's whole research lifecycle moved no sample: no request, job or release count.
    assert after == before
    # The same lifecycle of an ordinary release does move them (the check can fail).
    r = h.client.post(
        "/releases", json=_body(scene.dataset_id, research=False), headers=h.headers(scene.owner)
    )
    assert h.wait(scene.owner, r.json()["id"])["status"] == "succeeded"
    grown = _samples(h)
    assert grown[_RELEASES] == after[_RELEASES] + 1
    jobs = (
        'dprelease_job_duration_seconds_count{mechanism="local_perturbation",outcome="succeeded"}'
    )
    assert grown[jobs] == after[jobs] + 1
    route = (
        "dprelease_http_request_duration_seconds_count"
        '{method="GET",route="/releases/{release_id}",status="200"}'
    )
    assert grown[route] > after.get(route, 0)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # httpx logs the test client's requests (the owner's own process) and werkzeug the
        # test's S3 server (the object store's access log: docs/privacy.md, "Research
        # releases", says what an operator keeps of it); neither is the service's.
        if not record.name.startswith(("httpx", "httpcore", "werkzeug")):
            self.records.append(record)

    def text(self) -> str:
        return "\n".join(
            f"{r.name} {r.getMessage()} {r.args!r} {getattr(r, 'data', '')!r}" for r in self.records
        )


@pytest.fixture
def records() -> Iterator[_Records]:
    """Every log record of the process, caught by a handler set up like any other: added to
    the root logger before the filter is installed (as at the app's start)."""
    handler = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    owner_only.install()
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_logs_hold_nothing_of_a_research_release(
    harness: Harness, records: _Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each job logs its release id as it produces (patched in, as a careless log line
    would), and each request handler as it reads a release: the ordinary release's lines
    reach the handler, the research release's none."""
    from service.releases import service as release_service
    from worker import production

    job_log = logging.getLogger("worker.production")
    produce = production.produce

    def logged_produce(runtime: Any, job: Any, *args: Any) -> None:
        job_log.warning(
            "producing release %s (%s, params %s)", job.release_id, job.mechanism, job.params
        )
        produce(runtime, job, *args)

    api_log = logging.getLogger("service.releases.service")
    to_out = release_service.to_out

    def logged_to_out(release: Any, *, viewer: Any) -> Any:
        api_log.warning("serving release %s", release.id)
        return to_out(release, viewer=viewer)

    monkeypatch.setattr(production, "produce", logged_produce)
    monkeypatch.setattr(release_service, "to_out", logged_to_out)
    h = harness
    scene = _scene(h)
    assert f"producing release {scene.ordinary['id']}" in records.text()
    assert f"serving release {scene.ordinary['id']}" in records.text()
    start = len(records.records)
    rid = _research(h, scene)["id"]
    during = records.records[start:]
    assert rid not in records.text()
    # Not a line of this dataset's while the owner's research requests and its job ran (its
    # upload, grant and ordinary release came before; in real mode another test's job may log).
    mine = {scene.ordinary["id"], scene.dataset_id}
    assert [r.getMessage() for r in during if any(i in r.getMessage() for i in mine)] == []
