"""The composition roots: the API server (``service.run``) chooses the dispatcher with
``worker.dispatch.default_dispatcher`` and hands the app a way to build its runtime."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service import bootstrap
from service.app import create_app
from service.config import Settings
from service.run import app_factory, server_runtime
from service.runtime import InProcessDispatcher, Route, Runtime, build_runtime
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker.dispatch import CeleryDispatcher


class Dropped:
    """A dispatcher that loses every job, as a process that dies before running it would."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def enqueue(self, release_id: str, queue: Route) -> None:
        self.dropped.append(release_id)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)
    return tmp_path / "home"


def test_server_dispatches_in_process_without_a_broker_and_to_celery_with_one(home: Path) -> None:
    embedded = server_runtime(Settings(home=home))  # type: ignore[call-arg]
    queued = server_runtime(
        Settings(home=home, celery_broker_url="redis://127.0.0.1:6379/15")  # type: ignore[call-arg]
    )
    try:
        assert isinstance(embedded.dispatcher, InProcessDispatcher)
        assert isinstance(queued.dispatcher, CeleryDispatcher)
        # Jobs go to the Celery queue of their mechanism's pool and lane, named by the
        # settings.
        assert queued.dispatcher.queues == {
            ("cpu", "short"): "celery",
            ("cpu", "long"): "long",
            ("gpu", "short"): "gpu",
            ("gpu", "long"): "gpu-long",
        }
    finally:
        for runtime in (embedded, queued):
            runtime.dispatcher.shutdown()
            runtime.engine.dispose()


def test_embedded_server_resumes_unfinished_releases_at_start(home: Path) -> None:
    """A release left queued by a previous process is run in-process when the server built
    by ``service.run.app_factory`` starts."""
    settings = Settings(home=home)  # type: ignore[call-arg]
    bootstrap.prepare(settings)
    lost = Dropped()
    first: Runtime = build_runtime(settings, lambda _runtime: lost)
    try:
        with TestClient(create_app(runtime=first)) as client:
            h = Harness("embedded", client, first, (home / "admin.key").read_text().strip())
            owner, _ = h.new_key("owner")
            ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
            r = client.post("/releases", json=h.release_body(ds["id"]), headers=h.headers(owner))
            assert r.status_code == 202, r.text
            release_id = r.json()["id"]
    finally:
        first.engine.dispose()
    assert lost.dropped == [release_id]

    app = app_factory(settings)
    with TestClient(app) as client:
        runtime: Runtime = app.state.runtime
        assert isinstance(runtime.dispatcher, InProcessDispatcher)
        h = Harness("embedded", client, runtime, h.admin_key)
        assert h.wait(owner, release_id)["status"] == "succeeded"


def test_an_app_without_a_runtime_refuses_to_start(home: Path) -> None:
    app = create_app(Settings(home=home))  # type: ignore[call-arg]
    assert app.openapi()["info"]["title"] == "dprelease"  # it can still describe itself
    with pytest.raises(RuntimeError, match="app_factory"), TestClient(app):
        pass
