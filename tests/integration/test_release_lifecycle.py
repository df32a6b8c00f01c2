"""The life of a release after admission, in both modes, with the test-only mechanism
(tests/toy_mechanism.py) held at its gate: progress in rows or in the generator's own units,
with a phase."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    return owner, r.json()["id"]


def _toy_release(h: Harness, owner: str, dataset_id: str, **params: Any) -> dict[str, Any]:
    body = {
        "dataset_id": dataset_id,
        "mechanism": toy.NAME,
        "params": {"rows": 40, "totals_noise": 20.0, **params},
        "epsilon": 1.0,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created: dict[str, Any] = r.json()
    return created


def _wait_for(
    h: Harness,
    key: str,
    release_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60.0,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = h.client.get(f"/releases/{release_id}", headers=h.headers(key))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        if predicate(body):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


@pytest.mark.parametrize("own", [False, True], ids=["rows", "own"])
def test_progress_has_the_generators_phase(toy_harness: Harness, own: bool) -> None:
    """Rows counted by the worker show phase "rows"; a generator reporting its own progress
    shows its word ("means"). Both are written at once, then at most twice a second."""
    h = toy_harness
    owner, ds = _dataset(h)
    toy.GATE.clear()  # the generator waits before its first chunk
    rid = _toy_release(h, owner, ds, own_progress=own)["id"]
    held = _wait_for(h, owner, rid, lambda r: r["phase"] is not None)
    assert held["status"] == "running" and held["progress"] == 0.0
    assert held["phase"] == (toy.OWN_PHASE if own else "rows")
    toy.GATE.set()
    done = h.wait(owner, rid)
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0 and done["phase"] == held["phase"]
