"""The outbox sweeper: no release is left in limbo by a broker, a store or a job that died.

A committed queued release is the outbox of its job. Admission commits it (with its ledger
reservation) and only then hands it to the dispatcher; when that fails (the broker is down) the
request still answers 202 and the release waits here. Each pass of the sweeper, under a lease
so that one API process sweeps at a time:

- hands over again every release still ``queued`` with no sign of life (created, or last handed
  over) for ``sweep_queued_after_s``: a job that never reached the broker, or was lost there.
  The release is marked handed over (``releases.touched_at``) before it is sent, under the
  condition that it is still queued; if sending fails it is due again at the next pass, and the
  pass stops (the broker is down: the others would fail too). A job that is sent twice runs
  once: a job does nothing for a release that already ended;
- puts back to ``queued`` (under the row lock, audited ``release.requeued``) and hands over
  again every release still ``running`` with attempts left and no sign of life (start,
  progress) for ``sweep_running_after_s``: its attempt failed and the retry's message was lost,
  or its job died and no redelivery came (``lifecycle.requeue_stalled``). Its attempt stays
  counted, so a release whose every retry is lost reaches its last attempt (below); nothing is
  settled, and an upload claim stays recorded (charged whatever follows). It is queued rather
  than re-sent as it is so that an old job still alive after all stops at its next progress
  write or upload claim (they find it queued, then on a later attempt: both are fenced by the
  attempt number), a failure of the hand-over leaves it to the queued rule above, and a
  second message for it starts one attempt, not two;
- ends ``failed`` every release still ``running`` on its last attempt
  (``task_max_attempts``) with no sign of life (start, progress) for ``sweep_running_after_s``:
  its job died or could not record its end. It is settled like any failure, from its recorded
  marks (charged if an attempt claimed the upload or a job had begun reading the dataset,
  refunded otherwise), never by asking the object store (``lifecycle.settle_stalled``).

The lease is a row of ``sweeper_leases`` taken by a conditional UPDATE (or the INSERT of the
first row: the primary key lets one of two racing processes win), held ``sweep_lease_s`` and
renewed at each pass by its holder: the same on SQLite and Postgres, with no session-bound lock
to lose with a pooled connection. Lease times are the API hosts' clocks (UTC): keep them in
sync, well within ``sweep_lease_s``.

``service.app`` runs a pass at start-up and then every ``sweep_interval_s``, off the event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError

from service.db import transaction
from service.models import SweeperLease, utcnow
from service.releases import lifecycle, repository
from service.releases.mechanisms import route
from service.runtime import Runtime

log = logging.getLogger(__name__)

LEASE_NAME = "releases"
# Releases handled per kind and pass; the rest wait for the next pass.
BATCH = 500


@dataclass(frozen=True)
class SweepResult:
    """What one pass did: the releases handed over again, those it ended failed, and the
    running ones it put back in the queue (each also in ``resent`` once handed over)."""

    resent: tuple[str, ...] = ()
    settled: tuple[str, ...] = ()
    # Running with attempts left and no sign of life: queued again (and handed over).
    requeued: tuple[str, ...] = ()


class Sweeper:
    """One process's sweeper; ``holder`` names it in the lease table (unique per instance)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        holder: str | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.runtime = runtime
        self.holder = (
            holder or f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        )[:64]
        self.clock = clock

    def acquire(self) -> bool:
        """Take or renew the lease; False while another holder's lease runs."""
        now = self.clock()
        expires = now + timedelta(seconds=self.runtime.settings.sweep_lease_s)
        try:
            with transaction(self.runtime.session_factory) as session:
                stmt = (
                    update(SweeperLease)
                    .where(
                        SweeperLease.name == LEASE_NAME,
                        or_(SweeperLease.holder == self.holder, SweeperLease.expires_at <= now),
                    )
                    .values(holder=self.holder, expires_at=expires)
                    .execution_options(synchronize_session=False)
                )
                if session.execute(stmt).rowcount == 1:  # type: ignore[attr-defined]
                    return True
                if session.get(SweeperLease, LEASE_NAME) is not None:
                    return False
                session.add(SweeperLease(name=LEASE_NAME, holder=self.holder, expires_at=expires))
                session.flush()
                return True
        except IntegrityError:  # another process inserted the first row at the same time
            return False

    def sweep(self) -> SweepResult | None:
        """One pass; None when another process holds the lease."""
        if not self.acquire():
            return None
        now = self.clock()
        # Stalled running releases first: queued again, they are handed over by this pass.
        requeued = self._requeue(now)
        result = SweepResult(
            resent=self._resend(now, also=requeued), settled=self._settle(now), requeued=requeued
        )
        if result.resent or result.settled:
            self._log(result)
        return result

    def _log(self, result: SweepResult) -> None:
        # Research releases are not counted: their existence is their owner's alone.
        with transaction(self.runtime.session_factory) as session:
            research = repository.research_ids(
                session, [*result.resent, *result.requeued, *result.settled]
            )
        resent, requeued, settled = (
            [r for r in ids if r not in research]
            for ids in (result.resent, result.requeued, result.settled)
        )
        if resent or settled:
            log.info(
                "sweeper: handed over %d queued release(s) (%d of them stalled running), "
                "ended %d abandoned one(s)",
                len(resent),
                len(requeued),
                len(settled),
            )

    def _requeue(self, now: datetime) -> tuple[str, ...]:
        """Running with attempts left, no sign of life: back to the queue (lost retries)."""
        last = self.runtime.settings.task_max_attempts
        return self._stalled(now, {"below_attempts": last}, lifecycle.requeue_stalled)

    def _resend(self, now: datetime, *, also: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Hand over the queued releases due, and ``also`` those just queued again."""
        settings = self.runtime.settings
        before = now - timedelta(seconds=settings.sweep_queued_after_s)
        factory = self.runtime.session_factory
        with transaction(factory) as session:
            due = repository.queued_mechanisms(session, also) + repository.stale_queued(
                session, before=before, limit=BATCH
            )
        sent: list[str] = []
        for release_id, pending in {p.id: p for p in due}.items():  # each once, in order
            with transaction(factory) as session:
                if not repository.touch_queued(session, release_id=release_id, at=now):
                    continue  # started or settled meanwhile
            try:
                self.runtime.dispatcher.enqueue(
                    release_id, route(pending.mechanism, pending.work, settings)
                )
            except Exception:
                # No id: the release may be a research release (service.owner_only).
                log.warning("sweeper: a release could not be handed over; next pass", exc_info=True)
                with transaction(factory) as session:  # due again at the next pass
                    repository.touch_queued(session, release_id=release_id, at=before)
                break
            sent.append(release_id)
        return tuple(sent)

    def _settle(self, now: datetime) -> tuple[str, ...]:
        """Running on the last attempt, no sign of life: ended failed, settled from the claim."""
        last = self.runtime.settings.task_max_attempts
        return self._stalled(now, {"min_attempts": last}, lifecycle.settle_stalled)

    def _stalled(
        self,
        now: datetime,
        attempts: dict[str, int],
        act: Callable[..., bool],
    ) -> tuple[str, ...]:
        """Apply ``act`` (re-checked under the row lock) to each release running with no sign
        of life for ``sweep_running_after_s`` whose attempts match ``attempts``."""
        settings = self.runtime.settings
        before = now - timedelta(seconds=settings.sweep_running_after_s)
        factory = self.runtime.session_factory
        with transaction(factory) as session:
            stalled = repository.stale_running(session, before=before, limit=BATCH, **attempts)
        done: list[str] = []
        for release_id in stalled:
            with transaction(factory) as session:
                if act(
                    session,
                    release_id,
                    max_attempts=settings.task_max_attempts,
                    stale_before=before,
                ):
                    done.append(release_id)
        return tuple(done)
