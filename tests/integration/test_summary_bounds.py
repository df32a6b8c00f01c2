"""GET /releases/{id}/summary does bounded work (issue 35, M2): the summary is computed once,
reading the release file chunk by chunk, and kept beside the release for every later request;
computing one takes a slot of the key and of the process, and a request past either answers
503 summaries_busy with Retry-After."""

from __future__ import annotations

from typing import Any

import pytest

from service.models import Release
from service.releases import keys, summaries, summary
from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.test_release_summary import _dataset, _succeeded, _summary


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the release file was read again")


@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_the_summary_is_read_in_chunks_the_same_whatever_their_size(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Never the whole file at once: chunks of a few rows give the very summary one chunk
    of the whole file gives."""
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, npz_bytes(*toy_dataset()), [0, 13])
    # SGDRM's signed label columns are binned over their own min-max: the two-pass case.
    body = h.release_body(
        ds, mechanism="sgdrm", params={"mixture_width": 4, "n_samples": 100}, format=fmt
    )
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"])
    assert done["status"] == "succeeded", done
    monkeypatch.setattr(summary, "load_release_file", _refuse)
    with h.runtime.session_factory() as session:
        release = session.get(Release, done["id"])
        assert release is not None
        whole = summary.summarise(release, h.runtime.store, h.runtime.settings)
        monkeypatch.setattr(summary, "CHUNK_VALUES", 1)  # one row per chunk
        chunked = summary.summarise(release, h.runtime.store, h.runtime.settings)
    assert chunked == whole
    assert whole.rows == 100 and len(whole.samples) == 64
    assert {hist.range_source for hist in whole.histograms[-3:]} == {"release"}
    assert all(sum(hist.counts) + hist.below + hist.above == 100 for hist in whole.histograms)


def test_a_summary_is_computed_once_and_served_to_every_reader(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, npz_bytes(*toy_dataset()), [0, 13])
    release = _succeeded(h, owner, ds, format="csv")
    first = _summary(h, owner, release["id"])
    assert first.status_code == 200, first.text
    assert h.runtime.store.exists(keys.summary(release["id"], summaries.VERSION))

    monkeypatch.setattr(summary, "summarise", _refuse)
    for key in (owner, h.admin_key):
        again = _summary(h, key, release["id"])
        assert again.status_code == 200, again.text
        assert again.json() == first.json()


def test_summaries_computed_at_once_are_capped_per_key_and_per_process(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, owner_id = h.new_key("owner")
    ds = _dataset(h, owner, npz_bytes(*toy_dataset()), [0, 13])
    release = _succeeded(h, owner, ds)
    settings = h.runtime.settings
    assert settings.max_concurrent_summaries_per_key == 1

    # The owner's one slot is taken (another summary of theirs is being computed).
    with summaries._slot(owner_id, settings):
        r = _summary(h, owner, release["id"])
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "summaries_busy"
        assert error["detail"]["max_concurrent_summaries_per_key"] == 1
        assert int(r.headers["Retry-After"]) == settings.upload_retry_after_s
        assert not h.runtime.store.exists(keys.summary(release["id"], summaries.VERSION))

        # Another key computes it while the process has a slot left...
        assert _summary(h, h.admin_key, release["id"]).status_code == 200
        # ...and once stored, the owner is served the stored summary without a slot.
        assert _summary(h, owner, release["id"]).status_code == 200

    # The process's slots all taken: a summary not stored yet waits.
    other = _succeeded(h, owner, ds)
    monkeypatch.setattr(settings, "max_concurrent_summaries", 1)
    with summaries._slot("someone else", settings):
        r = _summary(h, owner, other["id"])
        assert r.status_code == 503, r.text
        assert r.json()["error"]["detail"]["max_concurrent_summaries"] == 1
    assert _summary(h, owner, other["id"]).status_code == 200
