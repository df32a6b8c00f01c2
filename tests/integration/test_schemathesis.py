"""Schemathesis against the committed OpenAPI schema, in-process on the embedded app.

Every operation, positive and negative data, every check schemathesis has (server errors,
status codes, content types, headers, response schemas, negative data rejected, positive data
accepted, auth not ignored, unsupported methods, Allow headers, …). Half of the cases are
pointed at objects that exist (a dataset, a release, a grant, an analyst), so that the code
behind the 404s runs too. Such a case may be refused for what that object is (asking a 200-row
dataset for mixtures of 500 rows is a 422 no schema can express), so the one check that data
valid by the schema must be accepted is left out for them, and for uploads (below), and only
there.

Every operation's test must have run cases (checked as its fixture ends); the number of cases
this process ran is printed (``-s``) and checked against a floor. Under xdist the operations
are spread over workers, so that floor covers the operations this process ran.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from service import openapi_export
from service.runtime import Route
from service.strict_json import has_nul
from tests.conftest import Harness, npz_bytes, toy_dataset

schema = schemathesis.openapi.from_dict(openapi_export.schema())
EXAMPLES = 15
ADMIN_ONLY = ("/api-keys", "/audit")

pytestmark = pytest.mark.slow  # property-based: schemathesis cases through hypothesis

# Ids of objects that exist, filled by the fixture.
EXISTING: dict[str, str] = {}
# (operation, pointed at existing objects, had an id that could be pointed)
CASES_RUN: list[tuple[str, bool, bool]] = []
BODY_IDS = ("dataset_id", "principal_id", "report_test_dataset_id")
_lock = threading.Lock()


class _NoJobs:
    """Admitted releases are not run here: the API is under test, not the mechanisms."""

    def enqueue(self, release_id: str, queue: Route) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _point_at_existing(case: Any) -> None:
    for name in list(case.path_parameters or {}):
        if name in EXISTING:
            case.path_parameters[name] = EXISTING[name]
    if isinstance(case.body, dict):
        for name in BODY_IDS:
            if isinstance(case.body.get(name), str):
                case.body[name] = EXISTING[name]


def _pointable(case: Any) -> bool:
    if any(name in EXISTING for name in case.path_parameters or {}):
        return True
    return isinstance(case.body, dict) and any(isinstance(case.body.get(n), str) for n in BODY_IDS)


def _points_at_existing(case: Any) -> bool:
    values = [*(case.path_parameters or {}).values()]
    if isinstance(case.body, dict):
        values += list(case.body.values())
    return any(isinstance(v, str) and v in EXISTING.values() for v in values)


@pytest.fixture
def keys(embedded: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    h = embedded
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "")
    owner, _ = h.new_key("owner")
    _, analyst_id = h.new_key("analyst")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    held_out = h.upload(owner, npz_bytes(*toy_dataset(seed=1))).json()
    release = h.client.post(
        "/releases",
        json=h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 20}),
        headers=h.headers(owner),
    ).json()
    assert h.wait(owner, release["id"])["status"] == "succeeded"
    grant = h.client.post(
        f"/datasets/{ds['id']}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    ).json()
    jobs, h.runtime.dispatcher = h.runtime.dispatcher, _NoJobs()
    EXISTING.update(
        dataset_id=ds["id"],
        release_id=release["id"],
        principal_id=analyst_id,
        report_test_dataset_id=held_out["id"],
        grant_id=grant["id"],
    )
    before = len(CASES_RUN)
    yield {"owner": owner, "admin": h.admin_key}
    EXISTING.clear()
    h.runtime.dispatcher = jobs  # the harness shuts its thread down
    assert len(CASES_RUN) > before, "schemathesis generated no case for this operation"


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: Any, keys: dict[str, str], embedded: Harness) -> None:
    key = keys["admin"] if case.path.startswith(ADMIN_ONLY) else keys["owner"]
    with _lock:
        number = len(CASES_RUN)
        if number % 2:  # every other case (schemathesis revalidates what changed)
            _point_at_existing(case)
    key_header = next((h for h in case.headers or {} if h.lower() == "idempotency-key"), None)
    if key_header and 0 < len(case.headers[key_header]) <= 190:
        # A key is state: reusing one with another body is refused (test_idempotency), so
        # every case gets its own.
        case.headers[key_header] += f"-{number}"
    # An upload's file is "format: binary": no schema says which bytes (and which file name)
    # make a dataset, so no upload schemathesis makes up is valid.
    upload = (case.method.upper(), case.path) == ("POST", "/datasets")
    # A NUL character (U+0000) anywhere is refused with 422 by design (docs/api.md, Errors:
    # the database cannot store it), though a JSON Schema string may hold one.
    nul = has_nul([case.path_parameters or {}, case.query or {}, case.body])
    excluded = [positive_data_acceptance] if upload or nul or _points_at_existing(case) else []
    with _lock:
        CASES_RUN.append(
            (f"{case.method.upper()} {case.path}", _points_at_existing(case), _pointable(case))
        )
    # Probes some checks send (without auth, other methods) go to this app too.
    case.operation.app = case.operation.schema.app = embedded.client.app
    case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, excluded_checks=excluded)


def test_schemathesis_ran_enough_cases() -> None:
    """Runs after the parametrized test (file order) in this process: the operations it ran
    had cases enough, and a tenth of the cases that named an object named an existing one."""
    operations = {f"{op.method.upper()} {op.path}" for op in _operations()}
    cases = [case for case in CASES_RUN if case[0] in operations]
    ran = {name for name, _, _ in cases}
    if not ran:
        pytest.skip("run with the schemathesis test")
    existing = sum(1 for _, pointed, _ in cases if pointed)
    pointable = sum(1 for _, _, could in cases if could)
    print(
        f"\nschemathesis: {len(cases)} cases over {len(ran)} of {len(operations)} operations, "
        f"{existing} of the {pointable} that named an object on existing objects"
    )
    assert len(cases) >= 5 * len(ran) and existing >= pointable // 10


def _operations() -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]
