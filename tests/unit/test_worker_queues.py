"""Routing of release jobs to worker pools: a mechanism's spec names its pool (``queue``), the
service looks it up, and the Celery dispatcher sends the job to that pool's Celery queue, named
by the settings (DPRELEASE_CPU_QUEUE, DPRELEASE_GPU_QUEUE)."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from dpcore.mechanisms import registry
from service.config import Settings
from service.releases.mechanisms import worker_queue
from tests import toy_mechanism as toy
from worker import dispatch
from worker.broker import RUN_RELEASE


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)


def _settings(**values: str) -> Settings:
    return Settings(home="unused", **values)  # type: ignore[call-arg,arg-type]


def test_queue_names_default_to_celerys_default_queue_and_gpu() -> None:
    settings = _settings()
    assert (settings.cpu_queue, settings.gpu_queue) == ("celery", "gpu")
    assert dispatch.CeleryDispatcher.from_settings(settings).queues == {
        "cpu": "celery",
        "gpu": "gpu",
    }


def test_celery_dispatcher_sends_each_job_to_its_pools_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    send_task = mock.Mock()
    monkeypatch.setattr(dispatch.celery_app, "send_task", send_task)
    dispatcher = dispatch.CeleryDispatcher.from_settings(
        _settings(cpu_queue="dp-cpu", gpu_queue="dp-gpu")
    )
    gpu_toy = toy.on_gpu()
    with registry.registered(gpu_toy):
        dispatcher.enqueue("r-gpu", worker_queue(gpu_toy.name))
    dispatcher.enqueue("r-cpu", worker_queue("dpmix"))
    assert send_task.call_args_list == [
        mock.call(RUN_RELEASE, args=["r-gpu"], queue="dp-gpu"),
        mock.call(RUN_RELEASE, args=["r-cpu"], queue="dp-cpu"),
    ]


def test_worker_queue_reads_the_spec() -> None:
    assert toy.SPEC.execution.queue == "cpu"
    with registry.registered(toy.SPEC):
        assert worker_queue(toy.NAME) == "cpu"
    with registry.registered(toy.on_gpu()):
        assert worker_queue(toy.NAME) == "gpu"
    for spec in registry.specs():
        assert worker_queue(spec.name) == spec.execution.queue
    # A release of a mechanism no longer registered: its job goes to the CPU pool (and fails
    # there, as it would anywhere).
    assert worker_queue("no_such_mechanism") == "cpu"
