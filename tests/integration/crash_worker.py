"""Test-only: a fork server of Celery workers whose jobs SIGKILL themselves at a chosen phase.

Run as ``python -m tests.integration.crash_worker PLAN_DIR`` with the worker's DPRELEASE_*
settings in the environment. It imports the worker (torch included) once, so that a fresh
worker costs a fork instead of a ten-second start, then answers one line on stdout for every
command line on stdin:

- ``spawn QUEUE POOL``: fork a fresh ``celery worker`` consuming QUEUE (``solo``: jobs run in
  the worker process itself, so the kill takes the whole worker down; ``prefork``: in a pool
  child, which the worker replaces) → ``pid PID``;
- ``wait PID SECONDS``: reap that worker → ``status CODE`` (negative: killed by that signal), or
  ``alive``;
- ``stop PID``: SIGTERM (warm shutdown), then reap → ``status CODE``.

Crash plan: a file ``PLAN_DIR/<release_id>`` holding ``PHASE TIMES`` makes the job of that
release SIGKILL its own process at PHASE (one of PHASES; ``before_read``: the dataset about to
be fetched, before the job records its private read; or ``shard_<index>_drawn``: a sharded
release's shard drawn, before its part is stored) on its first TIMES attempts (counted in
``PLAN_DIR/<release_id>.crashes``). Every phase reached is appended to ``PLAN_DIR/events`` as
``release_id phase pid time``. The hooks wrap the worker's functions in this process and its
children only: nothing in the service or the worker can turn them on.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

PHASES = ("before_noise", "after_noise", "after_claim", "after_upload", "after_commit")


def install_hooks(plan_dir: Path) -> None:
    from worker import production, publishing, writing

    events = plan_dir / "events"

    def note(release_id: str, what: str) -> None:
        with events.open("a") as handle:
            handle.write(f"{release_id} {what} {os.getpid()} {time.time():.3f}\n")

    def reach(release_id: str, phase: str) -> None:
        note(release_id, phase)
        plan = plan_dir / release_id
        if not plan.exists():
            return
        wanted, times = plan.read_text().split()
        crashes = plan_dir / f"{release_id}.crashes"
        done = int(crashes.read_text()) if crashes.exists() else 0
        if wanted != phase or done >= int(times):
            return
        crashes.write_text(str(done + 1))
        note(release_id, f"crash:{phase}")
        os.kill(os.getpid(), signal.SIGKILL)

    write_release, claim_upload, succeed, parsed = (
        writing.write_release,
        publishing.claim_upload,
        publishing.succeed,
        production.read_private,
    )

    def _parsed(runtime: Any, job: Any) -> Any:
        reach(job.release_id, "before_read")
        return parsed(runtime, job)

    def _write_release(runtime: Any, job: Any, *args: Any) -> Any:
        reach(job.release_id, "before_noise")
        meta = write_release(runtime, job, *args)
        reach(job.release_id, "after_noise")
        return meta

    def _claim_upload(runtime: Any, job: Any, *args: Any) -> bool:
        claimed = claim_upload(runtime, job, *args)
        if claimed:
            reach(job.release_id, "after_claim")
        return claimed

    def _succeed(runtime: Any, job: Any, **kwargs: Any) -> None:
        reach(job.release_id, "after_upload")
        succeed(runtime, job, **kwargs)
        reach(job.release_id, "after_commit")

    # A sharded release's shard, drawn but not yet stored (the phase "shard_<index>_drawn").
    from worker import shards

    store_part = shards.store_part

    def _store_part(store: Any, release_id: str, plan: Any, index: int, path: Any) -> bool:
        reach(release_id, f"shard_{index}_drawn")
        return store_part(store, release_id, plan, index, path)

    shards.store_part = _store_part  # type: ignore[assignment]
    production.read_private = _parsed  # type: ignore[assignment]
    writing.write_release = _write_release  # type: ignore[assignment]
    publishing.claim_upload = _claim_upload  # type: ignore[assignment]
    publishing.succeed = _succeed  # type: ignore[assignment]


def spawn(queue: str, pool: str) -> int:
    from worker.celery_app import celery_app

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.dup2(2, 1)  # stdout is the protocol channel: the worker logs to stderr
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        celery_app.worker_main(
            [
                "worker",
                "--pool",
                pool,
                "--concurrency",
                "1",
                "--queues",
                queue,
                "--hostname",
                f"crash-{os.getpid()}@%h",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        os._exit(code)


def reap(pid: int, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return f"status {-os.WTERMSIG(status)}"
            return f"status {os.WEXITSTATUS(status)}"
        if time.monotonic() > deadline:
            return "alive"
        time.sleep(0.05)


def main(plan_dir: Path) -> None:
    import worker.tasks  # noqa: F401  (registers the task before any fork)
    from worker.celery_app import celery_app

    install_hooks(plan_dir)
    # A fresh worker looks for jobs of dead workers (older than the visibility timeout) at
    # start; these make it keep looking every second after that.
    celery_app.conf.broker_transport_options = {
        **celery_app.conf.broker_transport_options,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    # A prefork worker notices a pool child that its job killed on the pool's upkeep timer
    # (every 5 s in Celery) unless the child's exit wakes it first; every 0.5 s here, so a
    # job's next attempt starts without waiting out the timer (the every-attempt test kills
    # six children).
    from celery.concurrency import asynpool

    asynpool.AsynPool.timers = property(  # type: ignore[method-assign,assignment]
        lambda pool: {pool.maintain_pool: 0.5}
    )
    children: set[int] = set()
    try:
        for line in sys.stdin:
            command, *args = line.split()
            if command == "spawn":
                pid = spawn(args[0], args[1])
                children.add(pid)
                answer = f"pid {pid}"
            elif command == "wait":
                answer = reap(int(args[0]), float(args[1]))
            elif command == "stop":
                os.kill(int(args[0]), signal.SIGTERM)
                answer = reap(int(args[0]), 30)
                if answer == "alive":
                    os.kill(int(args[0]), signal.SIGKILL)
                    answer = reap(int(args[0]), 10)
            else:
                answer = f"error unknown command {command!r}"
            if answer.startswith("status"):
                children.discard(int(args[0]))
            print(answer, flush=True)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


if __name__ == "__main__":
    main(Path(sys.argv[1]))
