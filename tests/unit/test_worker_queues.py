"""Routing of release jobs to worker pools and lanes: a mechanism's spec names its pool
(``queue``), the job's declared work at admission puts it in the pool's short or long lane
(DPRELEASE_LONG_JOB_WORK), and the Celery dispatcher sends the job to that pool and lane's
Celery queue, named by the settings (DPRELEASE_CPU_QUEUE, DPRELEASE_LONG_QUEUE,
DPRELEASE_GPU_QUEUE, DPRELEASE_GPU_LONG_QUEUE)."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest

from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import InvalidParams
from service.config import Settings
from service.releases.mechanisms import lane, route, worker_queue
from service.runtime import Route
from tests import toy_mechanism as toy
from tests.unit.test_job_work import SHAPES
from worker import dispatch
from worker.broker import FINISH_SHARDS, RUN_RELEASE, RUN_SHARD


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)


def _settings(**values: str) -> Settings:
    return Settings(home="unused", **values)  # type: ignore[call-arg,arg-type]


def test_queue_names_default_to_celerys_default_queue_gpu_and_their_long_lanes() -> None:
    settings = _settings()
    assert (settings.cpu_queue, settings.gpu_queue) == ("celery", "gpu")
    assert (settings.long_queue, settings.gpu_long_queue) == ("long", "gpu-long")
    assert dispatch.CeleryDispatcher.from_settings(settings).queues == {
        Route("cpu", "short"): "celery",
        Route("cpu", "long"): "long",
        Route("gpu", "short"): "gpu",
        Route("gpu", "long"): "gpu-long",
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
        dispatcher.enqueue("r-gpu", Route(worker_queue(gpu_toy.name)))
    dispatcher.enqueue("r-cpu", Route(worker_queue("dpmix")))
    assert send_task.call_args_list == [
        mock.call(RUN_RELEASE, args=["r-gpu"], queue="dp-gpu"),
        mock.call(RUN_RELEASE, args=["r-cpu"], queue="dp-cpu"),
    ]


def test_a_job_above_the_long_work_goes_to_its_pools_long_queue_with_its_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The routing rule end to end: a declared work above DPRELEASE_LONG_JOB_WORK sends the
    release, its shards and its finaliser to the long queue of its pool; at or below it, or
    with no declared work, to the short one (where every job went before lanes)."""
    send_task = mock.Mock()
    monkeypatch.setattr(dispatch.celery_app, "send_task", send_task)
    settings = _settings(
        cpu_queue="dp-cpu",
        long_queue="dp-long",
        gpu_queue="dp-gpu",
        gpu_long_queue="dp-gpu-long",
        long_job_work="1000",
    )
    dispatcher = dispatch.CeleryDispatcher.from_settings(settings)
    dispatcher.enqueue("r-big", route("dpmix", 1001.0, settings))
    dispatcher.enqueue("r-edge", route("dpmix", 1000.0, settings))
    dispatcher.enqueue("r-none", route("dpmix", None, settings))
    dispatcher.enqueue("r-dpgm", route("dpgm", 1e6, settings))
    dispatcher.enqueue("r-dpgm-small", route("dpgm", 10.0, settings))
    dispatcher.enqueue_shard("r-big", 1, 0, "plan", route("dpmix", 1001.0, settings))
    dispatcher.enqueue_finish("r-big", 1, "plan", route("dpmix", 1001.0, settings))
    assert send_task.call_args_list == [
        mock.call(RUN_RELEASE, args=["r-big"], queue="dp-long"),
        mock.call(RUN_RELEASE, args=["r-edge"], queue="dp-cpu"),
        mock.call(RUN_RELEASE, args=["r-none"], queue="dp-cpu"),
        mock.call(RUN_RELEASE, args=["r-dpgm"], queue="dp-gpu-long"),
        mock.call(RUN_RELEASE, args=["r-dpgm-small"], queue="dp-gpu"),
        mock.call(RUN_SHARD, args=["r-big", 1, 0, "plan"], queue="dp-long"),
        mock.call(FINISH_SHARDS, args=["r-big", 1, "plan"], queue="dp-long"),
    ]


@pytest.mark.parametrize("shape", ["mnist-10k", "mnist-60k", "adult"])
@pytest.mark.parametrize("spec", registry.served(), ids=lambda s: s.name)
def test_default_long_work_splits_fast_defaults_from_training(spec: Any, shape: str) -> None:
    """With the default DPRELEASE_LONG_JOB_WORK every fast mechanism's defaults on MNIST-sized
    data and on a census table stay in the short lane, while DPGM's training and AIM's rounds
    on the table go long (on MNIST AIM refuses the shape)."""
    settings = _settings()
    facts = SHAPES[shape]
    params = spec.resolve(spec.request_params.model_validate({}), facts)
    if spec.admission.check is not None:
        try:
            spec.admission.check(params, facts)
        except InvalidParams:
            pytest.skip(f"{spec.name} refuses this shape outright (its own check)")
    work = spec.work(params, facts)
    assert work is not None and work < settings.max_job_work
    expected = "long" if spec.name in ("dpgm", "aim") else "short"
    assert lane(work, settings) == expected, (spec.name, shape, work)


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
