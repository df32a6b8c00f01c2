"""A mechanism whose spec says ``queue="gpu"`` runs end to end in both modes: in real mode its job
is sent to the GPU queue (a built-in CPU mechanism's to the CPU queue) and the session's worker,
which consumes both queues as a CPU-only deployment's worker does, runs it; in embedded mode the
queue is irrelevant (jobs run in-process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dpcore.mechanisms import registry
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import dispatch

GPU_TOY = toy.on_gpu()


@pytest.fixture(params=["embedded", "real"])
def gpu_toy_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The harness with the toy mechanism registered as a GPU-queue one (before the app is
    built, so the API serves it)."""
    toy.GATE.set()
    with registry.registered(GPU_TOY):
        yield request.getfixturevalue(request.param)


def test_a_gpu_queue_mechanism_is_routed_to_the_gpu_queue_and_runs(
    gpu_toy_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = gpu_toy_harness
    sent: list[tuple[str, str]] = []
    send_task = dispatch.celery_app.send_task

    def spy(name: str, *, args: list[str], queue: str, **kwargs: Any) -> Any:
        sent.append((args[0], queue))
        return send_task(name, args=args, queue=queue, **kwargs)

    monkeypatch.setattr(dispatch.celery_app, "send_task", spy)
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    bodies = {
        "gpu": {
            "dataset_id": ds["id"],
            "mechanism": toy.NAME,
            "params": {"rows": 20, "totals_noise": 20.0},
            "epsilon": 1.0,
        },
        "cpu": h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 20}),
    }
    ids = {}
    for pool, body in bodies.items():
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 202, r.text
        ids[pool] = r.json()["id"]
    for release_id in ids.values():
        assert h.wait(owner, release_id)["status"] == "succeeded"
    if h.mode == "real":
        settings = h.runtime.settings
        assert sent == [
            (ids["gpu"], settings.gpu_queue),
            (ids["cpu"], settings.cpu_queue),
        ]
    else:
        assert sent == []  # embedded: in-process, no broker
