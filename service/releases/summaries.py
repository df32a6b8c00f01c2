"""``GET /releases/{id}/summary``, bounded: computed once per release and kept, a few at a
time per API process and one at a time per key.

A succeeded release's file never changes, so neither does its summary (a function of that
file alone, ``service.releases.summary``): the first request computes it and stores it beside
the release (``keys.summary``, create-only), and every later request, by any reader, serves the
stored copy without reading the release file or taking a slot. Computing one takes a slot of
the process (``max_concurrent_summaries``) and one of the requesting key
(``max_concurrent_summaries_per_key``); a request past either answers 503 ``summaries_busy``
with Retry-After, having read nothing. Storing it is post-processing of the release: no
privacy cost, and nothing the download's readers could not compute themselves.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from pydantic import ValidationError

from service.config import Settings
from service.errors import SummariesBusy
from service.models import Release
from service.releases import keys, summary
from service.releases.schemas import ReleaseSummary
from service.storage import ObjectExists, ObjectStore

# The computation's version in the stored summary's key: bump it when the summary changes,
# so a stored answer of an older computation is never served.
VERSION = 1

_lock = threading.Lock()
_by_key: Counter[str] = Counter()


@contextmanager
def _slot(principal_id: str, settings: Settings) -> Iterator[None]:
    cap, per_key = settings.max_concurrent_summaries, settings.max_concurrent_summaries_per_key
    retry = settings.upload_retry_after_s
    with _lock:
        if _by_key[principal_id] >= per_key:
            raise SummariesBusy(
                f"this key already has {per_key} release summary(ies) computed; retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_summaries_per_key": per_key},
            )
        if sum(_by_key.values()) >= cap:
            raise SummariesBusy(
                f"this server already computes {cap} release summary(ies); retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_summaries": cap},
            )
        _by_key[principal_id] += 1
    try:
        yield
    finally:
        with _lock:
            _by_key[principal_id] -= 1
            if _by_key[principal_id] <= 0:
                del _by_key[principal_id]


def summary_of(
    release: Release, principal_id: str, store: ObjectStore, settings: Settings
) -> ReleaseSummary:
    """The summary of a succeeded release (the caller checked access and status): the stored
    one, else computed under the slots and stored."""
    key = keys.summary(release.id, VERSION)
    stored = _stored(store, key)
    if stored is not None:
        return stored
    with _slot(principal_id, settings):
        stored = _stored(store, key)  # a request that held a slot meanwhile may have stored it
        if stored is not None:
            return stored
        computed = summary.summarise(release, store, settings)
        with suppress(ObjectExists):  # a concurrent request stored the same summary
            store.put(key, computed.model_dump_json().encode())
    return computed


def _stored(store: ObjectStore, key: str) -> ReleaseSummary | None:
    if not store.exists(key):
        return None
    try:
        return ReleaseSummary.model_validate_json(store.get(key))
    except ValidationError:
        return None  # unreadable (a partial write): computed again, served, not re-stored
