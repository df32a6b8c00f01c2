"""The states of a release: the one list that the model, the API schema, the queries, the
lifecycle and the worker use.

queued → running → succeeded | failed | cancelled (a queued release may also be cancelled or
fail at start). The database refuses any other value (a CHECK constraint, migration 0010, whose
list tests/integration/test_release_status.py compares with this enum: a new status needs a
migration).
"""

from __future__ import annotations

from enum import StrEnum


class ReleaseStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


# A release in one of these never changes state again (a job that finds one does nothing).
TERMINAL = frozenset({ReleaseStatus.succeeded, ReleaseStatus.failed, ReleaseStatus.cancelled})
# Releases a job may still run for (and that may still read their dataset's raw data).
UNFINISHED = (ReleaseStatus.queued, ReleaseStatus.running)
