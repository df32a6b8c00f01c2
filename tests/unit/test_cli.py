"""The ``dprelease`` CLI against an in-memory emulation of the REST API (httpx.MockTransport)."""

from __future__ import annotations

import email
import hashlib
import json
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from dprelease_cli.client import ApiError, Client
from dprelease_cli.main import CliState, cli, parse_params, parse_value

KEY = "test-key-0123456789"
BASE = "http://api.test:8000"
ARTIFACT = b"PK\x03\x04 pretend this is an npz file" * 100
ARTIFACT_SHA = hashlib.sha256(ARTIFACT).hexdigest()
STORAGE = "http://storage.test:9000"
WEIGHTS = b'{"w": [1, 2, 3]}'
WEIGHTS_SHA = hashlib.sha256(WEIGHTS).hexdigest()

DONE = {"status": "succeeded", "progress": 1.0}

Handler = Callable[[httpx.Request], httpx.Response]


def _error(status: int, code: str, message: str, detail: dict[str, Any] | None = None) -> Any:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "detail": detail or {}}}
    )


class FakeApi:
    """Emulates the endpoints the CLI uses and records every request it sees."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.release_states: list[dict[str, Any]] = [
            {"status": "queued", "progress": 0.0},
            {"status": "running", "progress": 0.25},
            {"status": "running", "progress": 0.75},
            DONE,
        ]
        self.polls = 0
        self.artifact = ARTIFACT
        self.declared_sha = ARTIFACT_SHA
        self.redirect_download = False
        self.overrides: dict[tuple[str, str], Handler] = {}

    # -- helpers for assertions ------------------------------------------------------------

    def sent(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def only(self, method: str, path: str) -> httpx.Request:
        found = self.sent(method, path)
        assert len(found) == 1, [f"{r.method} {r.url}" for r in self.requests]
        return found[0]

    # -- the emulation ---------------------------------------------------------------------

    def _release(self, state: dict[str, Any]) -> dict[str, Any]:
        done = state["status"] == "succeeded"
        return {
            "id": "rel-1",
            "dataset_id": "ds-1",
            "status": state["status"],
            "progress": state["progress"],
            "phase": state.get("phase"),
            "noise": {"sigma_x": 1.5, "sigma_y": 1.5},
            "charge": {"epsilon": 1.0, "delta": 1e-5},
            "error": state.get("error"),
            "settlement": state.get("settlement"),
            "artifact": (
                {"format": "npz", "bytes": len(self.artifact), "sha256": self.declared_sha}
                if done
                else None
            ),
            "artifacts": (
                [{"name": "weights.json", "bytes": len(WEIGHTS), "sha256": WEIGHTS_SHA}]
                if done
                else []
            ),
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.url.host == "storage.test":
            return httpx.Response(200, content=self.artifact)
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return _error(401, "not_authenticated", "missing or unknown API key")
        method, path = request.method, request.url.path
        override = self.overrides.get((method, path))
        if override is not None:
            return override(request)
        is_json = request.headers.get("content-type") == "application/json"
        body: dict[str, Any] = json.loads(request.content) if is_json else {}
        if (method, path) == ("POST", "/api-keys"):
            return httpx.Response(
                201,
                json={"principal_id": "p-2", "key_id": "k-2", "key": "dpr_secret", **body},
            )
        if (method, path) == ("GET", "/api-keys"):
            return httpx.Response(200, json={"items": [{"id": "k-1", "active": True}]})
        if (method, path) == ("DELETE", "/api-keys/k-1"):
            return httpx.Response(204)
        if (method, path) == ("GET", "/me"):
            return httpx.Response(
                200, json={"principal_id": "p-1", "name": "root", "role": "admin"}
            )
        if (method, path) == ("POST", "/datasets"):
            return httpx.Response(201, json={"id": "ds-1", "name": "mnist", "clipped_values": 3})
        if (method, path) == ("GET", "/datasets"):
            return httpx.Response(200, json={"items": [{"id": "ds-1"}]})
        if (method, path) == ("GET", "/datasets/ds-1"):
            return httpx.Response(200, json={"id": "ds-1", "name": "mnist"})
        if (method, path) == ("POST", "/datasets/ds-1/grants"):
            return httpx.Response(201, json={"id": "g-1", "dataset_id": "ds-1", **body})
        if (method, path) == ("GET", "/datasets/ds-1/grants"):
            return httpx.Response(200, json={"items": [{"id": "g-1", "principal_id": "p-9"}]})
        if (method, path) == ("DELETE", "/datasets/ds-1/grants/g-1"):
            return httpx.Response(204)
        if (method, path) == ("DELETE", "/datasets/ds-1"):
            return httpx.Response(200, json={"id": "ds-1", "status": "deleted"})
        if (method, path) == ("POST", "/releases"):
            return httpx.Response(202, json=self._release(self.release_states[0]))
        if (method, path) == ("POST", "/releases/preview"):
            return httpx.Response(
                200,
                json={
                    "noise": {"sigma_x": 1.5, "sigma_y": 1.5},
                    "charge": {"epsilon": 1.0, "delta": 1e-5},
                    "accountant": "tight",
                    "budget": {"remaining_after": 2.0, "admissible": True},
                },
            )
        if (method, path) == ("GET", "/releases"):
            return httpx.Response(200, json={"items": [self._release(self.release_states[-1])]})
        if (method, path) == ("GET", "/releases/rel-1"):
            self.polls += 1
            state = self.release_states[min(self.polls, len(self.release_states) - 1)]
            return httpx.Response(200, json=self._release(state))
        if (method, path) == ("POST", "/releases/rel-1/cancel"):
            cancelled = {
                "status": "cancelled",
                "progress": 0.1,
                "settlement": {"state": "committed", "because": "private_data_read"},
            }
            return httpx.Response(200, json=self._release(cancelled))
        if (method, path) == ("GET", "/releases/rel-1/artifacts/weights.json"):
            return httpx.Response(200, content=WEIGHTS)
        if (method, path) == ("GET", "/releases/rel-1/download"):
            if self.redirect_download:
                return httpx.Response(
                    307, headers={"Location": f"{STORAGE}/bucket/releases/rel-1.npz?X-Sig=abc"}
                )
            return httpx.Response(200, content=self.artifact)
        if (method, path) == ("GET", "/budgets"):
            return httpx.Response(200, json={"items": [{"dataset_id": "ds-1"}]})
        if (method, path) == ("GET", "/budgets/ds-1"):
            return httpx.Response(200, json={"dataset_id": "ds-1", "entries": []})
        return _error(404, "not_found", f"no route {method} {path}")


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture(autouse=True)
def _no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client sleeps between polls and retries (Client.sleep is time.sleep).
    monkeypatch.setattr("time.sleep", lambda _s: None)


@pytest.fixture
def run(api: FakeApi, tmp_path: Path) -> Iterator[Callable[..., Result]]:
    http = httpx.Client(transport=httpx.MockTransport(api.handle))

    def invoke(*args: str, env: dict[str, str | None] | None = None, key: bool = True) -> Result:
        base_env: dict[str, str | None] = {
            "DPRELEASE_URL": BASE,
            "DPRELEASE_KEY": KEY if key else None,
            "DPRELEASE_HOME": str(tmp_path / "home"),
        }
        base_env.update(env or {})
        return CliRunner().invoke(cli, list(args), obj=CliState(http=http), env=base_env)

    yield invoke
    http.close()


def out(result: Result) -> Any:
    return json.loads(result.stdout)


def part_bytes(part: Message) -> bytes:
    payload = part.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload


def multipart_parts(request: httpx.Request) -> dict[str, Message]:
    raw = b"Content-Type: " + request.headers["content-type"].encode() + b"\r\n\r\n"
    message = email.message_from_bytes(raw + request.content)
    assert message.is_multipart()
    parts: dict[str, Message] = {}
    for part in message.get_payload():
        assert isinstance(part, Message)
        name = part.get_param("name", header="content-disposition")
        parts[str(name)] = part
    return parts


# -- parsing helpers -----------------------------------------------------------------------


def test_param_values_parse_as_int_then_float_then_string() -> None:
    assert parse_value("64") == 64 and isinstance(parse_value("64"), int)
    assert parse_value("0.5") == 0.5
    assert parse_value("1e-3") == 1e-3
    assert parse_value("fast") == "fast"
    assert parse_value("true") is True and parse_value("false") is False  # JSON booleans
    assert parse_value("nan") == "nan"  # non-finite floats stay strings (not valid JSON)
    assert parse_params(["a=1", "b = x=y"]) == {"a": 1, "b": " x=y"}


@pytest.mark.parametrize("bad", [["novalue"], ["=3"], ["a=1", "a=2"]])
def test_bad_params_are_usage_errors(
    run: Callable[..., Result], api: FakeApi, bad: list[str]
) -> None:
    args = ["release", "ds-1", "--epsilon", "1"]
    for item in bad:
        args += ["-p", item]
    result = run(*args)
    assert result.exit_code == 2
    assert api.requests == []


# -- key and url resolution ----------------------------------------------------------------


def test_whoami_sends_bearer_key_to_url(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("whoami")
    assert result.exit_code == 0, result.output
    assert out(result) == {"principal_id": "p-1", "name": "root", "role": "admin"}
    request = api.only("GET", "/me")
    assert str(request.url) == f"{BASE}/me"
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_url_and_key_options_override_env(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("--url", "http://other.test:1234/", "--key", KEY, "whoami", key=False)
    assert result.exit_code == 0, result.output
    assert str(api.requests[0].url) == "http://other.test:1234/me"
    run("--url", "http://proxy.test/dprelease", "whoami")  # a base path is kept
    assert str(api.requests[1].url) == "http://proxy.test/dprelease/me"


def test_key_falls_back_to_admin_key_file(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "admin.key").write_text(KEY + "\n")
    result = run("whoami", key=False)
    assert result.exit_code == 0, result.output
    assert api.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_missing_key_is_an_error_and_sends_nothing(
    run: Callable[..., Result], api: FakeApi
) -> None:
    result = run("whoami", key=False)
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: no API key: pass --key or set DPRELEASE_KEY"
    assert result.stdout == ""
    assert api.requests == []


def test_help_needs_no_key(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("--help", key=False)
    assert result.exit_code == 0
    assert "release" in result.stdout
    assert api.requests == []


# -- keys, datasets, grants ----------------------------------------------------------------


def test_keys_create(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("keys", "create", "--name", "alice", "--role", "analyst")
    assert result.exit_code == 0, result.output
    assert json.loads(api.only("POST", "/api-keys").content) == {"name": "alice", "role": "analyst"}
    assert out(result)["key"] == "dpr_secret"
    assert "cannot be shown again" in result.stderr


def test_keys_create_rejects_unknown_role(run: Callable[..., Result], api: FakeApi) -> None:
    assert run("keys", "create", "--name", "x", "--role", "root").exit_code == 2
    assert api.requests == []


def test_keys_create_another_key_with_expiry(run: Callable[..., Result], api: FakeApi) -> None:
    from datetime import UTC, datetime, timedelta, timezone

    result = run("keys", "create", "--principal", "p-1", "--expires", "30d")
    assert result.exit_code == 0, result.output
    sent = json.loads(api.only("POST", "/api-keys").content)
    assert sent == {"principal_id": "p-1", "expires_in": 30 * 86400}
    at = (datetime.now(UTC) + timedelta(hours=2)).astimezone(timezone(timedelta(hours=1)))
    result = run("keys", "create", "--name", "a", "--role", "owner", "--expires", at.isoformat())
    assert result.exit_code == 0, result.output
    seconds = json.loads(api.sent("POST", "/api-keys")[1].content)["expires_in"]
    assert 7200 - 60 <= seconds <= 7201


@pytest.mark.parametrize(
    "args",
    [
        ["--name", "a"],
        ["--principal", "p-1", "--role", "owner"],
        ["--name", "a", "--role", "owner", "--expires", "2030-01-01T00:00"],
        ["--name", "a", "--role", "owner", "--expires", "soon"],
        ["--name", "a", "--role", "owner", "--expires", "2020-01-01T00:00+00:00"],
        ["--name", "a", "--role", "owner", "--expires", "0d"],
    ],
)
def test_keys_create_option_errors(
    run: Callable[..., Result], api: FakeApi, args: list[str]
) -> None:
    assert run("keys", "create", *args).exit_code == 2
    assert api.requests == []


def test_keys_list_and_revoke(run: Callable[..., Result], api: FakeApi) -> None:
    assert out(run("keys", "list"))["items"][0]["id"] == "k-1"
    assert out(run("keys", "revoke", "k-1")) == {"revoked": "k-1"}
    api.only("DELETE", "/api-keys/k-1")


def test_upload_sends_file_and_metadata(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    data = tmp_path / "train.csv"
    data.write_text("x,y,label\n0.1,0.2,a\n0.3,0.4,b\n")
    result = run(
        "upload", str(data), "--name", "mnist", "--label-column", "label",
        "--feature-range", "0", "1", "--classes", '["a", "b"]',
        "--epsilon", "8", "--delta", "1e-5",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out(result)["id"] == "ds-1"
    assert "3 feature values" in result.stderr
    request = api.only("POST", "/datasets")
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    parts = multipart_parts(request)
    assert parts["file"].get_filename() == "train.csv"
    assert part_bytes(parts["file"]) == data.read_bytes()
    metadata = json.loads(part_bytes(parts["metadata"]))
    assert metadata == {
        "name": "mnist",
        "label_column": "label",
        "feature_range": [0.0, 1.0],
        "classes": ["a", "b"],
        "budget": {"epsilon": 8.0, "delta": 1e-5},
    }


def test_upload_per_column_ranges(run: Callable[..., Result], api: FakeApi, tmp_path: Path) -> None:
    data = tmp_path / "d.npz"
    data.write_bytes(b"npz")
    ranges = {"0": [0, 255], "1": [-1, 1]}
    result = run(
        "upload", str(data), "--name", "d", "--feature-range-json", json.dumps(ranges),
        "--epsilon", "1", "--delta", "1e-6",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = json.loads(part_bytes(multipart_parts(api.requests[0])["metadata"]))
    assert metadata == {
        "name": "d",
        "feature_range": ranges,
        "budget": {"epsilon": 1.0, "delta": 1e-6},
    }


def test_upload_declared_columns(run: Callable[..., Result], api: FakeApi, tmp_path: Path) -> None:
    data = tmp_path / "patients.csv"
    data.write_bytes(b"sex,age,y\nF,40,0\n")
    columns = [
        {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
        {"name": "age", "type": "numeric", "bounds": [0, 120], "missing": {"policy": "indicator"}},
    ]
    spec = tmp_path / "columns.json"
    spec.write_text(json.dumps(columns))
    result = run(
        "upload", str(data), "--name", "p", "--label-column", "y", "--columns", str(spec),
        "--epsilon", "1", "--delta", "1e-6",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = json.loads(part_bytes(multipart_parts(api.requests[0])["metadata"]))
    assert metadata["columns"] == columns and "feature_range" not in metadata


@pytest.mark.parametrize(
    "extra",
    [
        [],  # neither range option
        ["--feature-range", "0", "1", "--feature-range-json", "[0, 1]"],  # both
        ["--feature-range-json", "{not json"],
        ["--feature-range-json", "3"],
        ["--feature-range", "0", "1", "--classes", '{"a": 1}'],
        ["--feature-range", "0", "1", "--columns", __file__],  # two declarations
    ],
)
def test_upload_option_errors(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path, extra: list[str]
) -> None:
    data = tmp_path / "d.npz"
    data.write_bytes(b"npz")
    result = run("upload", str(data), "--name", "d", "--epsilon", "1", "--delta", "1e-6", *extra)
    assert result.exit_code == 2, result.output
    assert api.requests == []


def test_datasets_grant_budgets_status_releases(run: Callable[..., Result], api: FakeApi) -> None:
    assert out(run("datasets")) == {"items": [{"id": "ds-1"}]}
    assert out(run("datasets", "ds-1"))["name"] == "mnist"
    granted = run("grant", "ds-1", "p-9")
    assert granted.exit_code == 0, granted.output
    assert json.loads(api.only("POST", "/datasets/ds-1/grants").content) == {"principal_id": "p-9"}
    assert out(run("budgets"))["items"][0]["dataset_id"] == "ds-1"
    assert out(run("budgets", "ds-1"))["entries"] == []
    assert out(run("status", "rel-1"))["id"] == "rel-1"
    listed = run("releases", "--dataset-id", "ds-1")
    assert out(listed)["items"][0]["status"] == "succeeded"
    assert api.only("GET", "/releases").url.params["dataset_id"] == "ds-1"
    run("releases")
    assert "dataset_id" not in api.sent("GET", "/releases")[1].url.params


def test_grants_revoke_and_delete(run: Callable[..., Result], api: FakeApi) -> None:
    assert out(run("grants", "ds-1"))["items"][0]["id"] == "g-1"
    assert out(run("revoke", "ds-1", "g-1")) == {"revoked": "g-1", "dataset_id": "ds-1"}
    api.only("DELETE", "/datasets/ds-1/grants/g-1")
    unconfirmed = run("delete", "ds-1")
    assert unconfirmed.exit_code == 2 and api.sent("DELETE", "/datasets/ds-1") == []
    assert out(run("delete", "ds-1", "--yes"))["status"] == "deleted"
    api.only("DELETE", "/datasets/ds-1")


def test_ids_are_quoted_into_one_path_segment(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("datasets", "../me")
    assert result.exit_code == 1
    assert api.requests[0].url.raw_path == b"/datasets/..%2Fme"


# -- releases ------------------------------------------------------------------------------


def test_release_waits_with_progress_then_downloads(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    target = tmp_path / "out" / "release.npz"
    result = run(
        "release", "ds-1", "--mechanism", "dpmix", "-p", "mixture_degree=64",
        "-p", "n_samples=10000", "-p", "lr=0.5", "-p", "mode=fast",
        "--epsilon", "1", "--delta", "1e-5",
        "--accountant", "tight", "--noise-ratio", "2", "--output", str(target),
        "--poll-interval", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(api.only("POST", "/releases").content) == {
        "dataset_id": "ds-1",
        "mechanism": "dpmix",
        "params": {"mixture_degree": 64, "n_samples": 10000, "lr": 0.5, "mode": "fast"},
        "format": "npz",
        "epsilon": 1.0,
        "noise_ratio": 2.0,
        "delta": 1e-5,
        "accountant": "tight",
    }
    # polled until succeeded, then stopped
    assert len(api.sent("GET", "/releases/rel-1")) == 3
    final = out(result)
    assert final["status"] == "succeeded"
    assert final["artifact"]["sha256"] == ARTIFACT_SHA
    assert target.read_bytes() == ARTIFACT
    assert list(target.parent.iterdir()) == [target]  # no temp file left behind
    assert "100%" in result.stderr
    assert "sha256 verified" in result.stderr


def test_release_with_explicit_noise(run: Callable[..., Result], api: FakeApi) -> None:
    result = run(
        "release", "ds-1", "--sigma-x", "2.5", "--sigma-y", "3", "--format", "csv",
        "--mechanism", "other", "--no-wait",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(api.only("POST", "/releases").content) == {
        "dataset_id": "ds-1",
        "mechanism": "other",
        "params": {},
        "format": "csv",
        "noise": {"sigma_x": 2.5, "sigma_y": 3.0},
    }
    assert out(result)["status"] == "queued"
    assert api.sent("GET", "/releases/rel-1") == []  # --no-wait: no polling


@pytest.mark.parametrize(
    "args",
    [
        [],  # neither --epsilon nor --sigma-x
        ["--epsilon", "1", "--sigma-x", "2"],
        ["--epsilon", "1", "--sigma-y", "2"],
        ["--epsilon", "1", "--no-wait", "--output", "x.npz"],
        ["--epsilon", "1", "--format", "xlsx"],
    ],
)
def test_release_option_errors(run: Callable[..., Result], api: FakeApi, args: list[str]) -> None:
    result = run("release", "ds-1", *args)
    assert result.exit_code == 2, result.output
    assert api.requests == []


def test_release_progress_shows_the_phase(run: Callable[..., Result], api: FakeApi) -> None:
    api.release_states = [
        {"status": "queued", "progress": 0.0},
        {"status": "running", "progress": 0.3, "phase": "epochs"},
        DONE,
    ]
    result = run("release", "ds-1", "--epsilon", "1", "--poll-interval", "0")
    assert result.exit_code == 0, result.output
    assert "running: epochs" in result.stderr
    assert "100%" in result.stderr


def test_release_cancelled_meanwhile_exits_1(run: Callable[..., Result], api: FakeApi) -> None:
    api.release_states = [
        {"status": "running", "progress": 0.2},
        {
            "status": "cancelled",
            "progress": 0.2,
            "settlement": {"state": "refunded", "because": "before_private_read"},
        },
    ]
    result = run("release", "ds-1", "--epsilon", "1", "--poll-interval", "0")
    assert result.exit_code == 1
    assert "error: release rel-1 was cancelled; its charge was refunded" in result.stderr
    assert out(result)["status"] == "cancelled"
    assert len(api.sent("GET", "/releases/rel-1")) == 1  # the wait ended there


def test_cancel(run: Callable[..., Result], api: FakeApi) -> None:
    result = run("cancel", "rel-1")
    assert result.exit_code == 0, result.output
    assert api.only("POST", "/releases/rel-1/cancel").content == b""
    assert out(result)["status"] == "cancelled"
    # What became of the charge: its job had read the data, so it stands.
    assert "release rel-1 cancelled; its charge stands (committed)" in result.stderr
    assert "reading the private data" in result.stderr


def test_a_failed_release_says_its_charge_stands(run: Callable[..., Result], api: FakeApi) -> None:
    api.release_states = [
        {"status": "running", "progress": 0.2},
        {
            "status": "failed",
            "progress": 0.2,
            "error": "ValueError: class 1 has fewer records than mixture_degree",
            "settlement": {"state": "committed", "because": "private_data_read"},
        },
    ]
    result = run("release", "ds-1", "--epsilon", "1", "--poll-interval", "0")
    assert result.exit_code == 1
    assert "failed: ValueError: class 1 has fewer records" in result.stderr
    assert "its charge stands (committed)" in result.stderr
    status = run("status", "rel-1")
    assert status.exit_code == 0, status.output
    assert "release rel-1 failed; its charge stands (committed)" in status.stderr
    assert out(status)["settlement"]["because"] == "private_data_read"


def test_cancel_of_a_finished_release_is_an_error(run: Callable[..., Result], api: FakeApi) -> None:
    api.overrides[("POST", "/releases/rel-1/cancel")] = lambda _r: _error(
        409, "release_finished", "release rel-1 already succeeded", {"status": "succeeded"}
    )
    result = run("cancel", "rel-1")
    assert result.exit_code == 1
    assert "error: release rel-1 already succeeded" in result.stderr


def test_release_failure_exits_1(run: Callable[..., Result], api: FakeApi) -> None:
    api.release_states = [
        {"status": "queued", "progress": 0.0},
        {"status": "failed", "progress": 0.4, "error": {"code": "oom", "message": "out of memory"}},
    ]
    result = run("release", "ds-1", "--epsilon", "1", "--poll-interval", "0")
    assert result.exit_code == 1
    assert "error: release rel-1 failed: out of memory" in result.stderr
    assert out(result)["status"] == "failed"


def test_release_wait_timeout(run: Callable[..., Result], api: FakeApi) -> None:
    api.release_states = [{"status": "running", "progress": 0.5}]
    result = run("release", "ds-1", "--epsilon", "1", "--timeout", "0", "--poll-interval", "0")
    assert result.exit_code == 1
    assert "timed out" in result.stderr and "dprelease status rel-1" in result.stderr
    assert out(result)["status"] == "running"


def test_release_error_with_detail_is_rendered(run: Callable[..., Result], api: FakeApi) -> None:
    detail = {"requested_epsilon": 4.0, "remaining": 0.5}
    api.overrides[("POST", "/releases")] = lambda _r: _error(
        409, "budget_exceeded", "the release would exceed the dataset's budget", detail
    )
    result = run("release", "ds-1", "--epsilon", "4")
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "error: the release would exceed the dataset's budget"
    assert json.loads("\n".join(lines[1:])) == detail


def test_error_without_detail_prints_only_message(run: Callable[..., Result], api: FakeApi) -> None:
    api.overrides[("GET", "/me")] = lambda _r: _error(403, "forbidden", "admins only")
    result = run("whoami")
    assert result.exit_code == 1
    assert result.stderr == "error: admins only\n"


def test_non_json_error_body(run: Callable[..., Result], api: FakeApi) -> None:
    api.overrides[("GET", "/me")] = lambda _r: httpx.Response(502, text="Bad gateway from proxy")
    result = run("whoami")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: HTTP 502 Bad Gateway: Bad gateway from proxy")


def test_connection_error(api: FakeApi) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    http = httpx.Client(transport=httpx.MockTransport(refuse))
    result = CliRunner().invoke(
        cli, ["--url", BASE, "--key", KEY, "whoami"], obj=CliState(http=http)
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot reach the API at {BASE}: connection refused")


def test_preview(run: Callable[..., Result], api: FakeApi) -> None:
    result = run(
        "preview", "ds-1", "--mechanism", "dpmix", "-p", "mixture_degree=8", "--epsilon", "0.5"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(api.only("POST", "/releases/preview").content) == {
        "dataset_id": "ds-1",
        "mechanism": "dpmix",
        "params": {"mixture_degree": 8},
        "format": "npz",
        "epsilon": 0.5,
    }
    assert out(result)["budget"]["admissible"] is True
    assert api.sent("POST", "/releases") == []


# -- download ------------------------------------------------------------------------------


def test_download_verifies_sha256(run: Callable[..., Result], api: FakeApi, tmp_path: Path) -> None:
    api.release_states = [DONE]
    target = tmp_path / "r.npz"
    target.write_bytes(b"old contents")  # replaced atomically
    result = run("download", "rel-1", "--output", str(target))
    assert result.exit_code == 0, result.output
    assert out(result) == {"path": str(target), "bytes": len(ARTIFACT), "sha256": ARTIFACT_SHA}
    assert target.read_bytes() == ARTIFACT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.npz"]


def test_download_checksum_mismatch_fails_and_leaves_nothing(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    api.release_states = [DONE]
    api.artifact = b"tampered"
    target = tmp_path / "r.npz"
    result = run("download", "rel-1", "--output", str(target))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "error: checksum mismatch for release rel-1" in result.stderr
    assert ARTIFACT_SHA in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_download_follows_redirect_without_leaking_key(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    api.release_states = [DONE]
    api.redirect_download = True
    target = tmp_path / "r.npz"
    result = run("download", "rel-1", "--output", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == ARTIFACT
    to_api = api.only("GET", "/releases/rel-1/download")
    assert to_api.headers["authorization"] == f"Bearer {KEY}"
    to_storage = [r for r in api.requests if r.url.host == "storage.test"]
    assert len(to_storage) == 1
    assert to_storage[0].url.params["X-Sig"] == "abc"
    assert "authorization" not in to_storage[0].headers


def test_download_a_further_file(run: Callable[..., Result], api: FakeApi, tmp_path: Path) -> None:
    api.release_states = [DONE]
    target = tmp_path / "w.json"
    result = run("download", "rel-1", "--artifact", "weights.json", "--output", str(target))
    assert result.exit_code == 0, result.output
    assert out(result) == {"path": str(target), "bytes": len(WEIGHTS), "sha256": WEIGHTS_SHA}
    assert target.read_bytes() == WEIGHTS
    assert api.sent("GET", "/releases/rel-1/download") == []

    unknown = run("download", "rel-1", "--artifact", "model.pt", "--output", str(target))
    assert unknown.exit_code == 1
    assert "error: release rel-1 has no artifact named 'model.pt'" in unknown.stderr
    assert "weights.json" in unknown.stderr  # the names it has


def test_download_not_ready(run: Callable[..., Result], api: FakeApi, tmp_path: Path) -> None:
    api.release_states = [{"status": "running", "progress": 0.5}]
    result = run("download", "rel-1", "--output", str(tmp_path / "r.npz"))
    assert result.exit_code == 1
    assert "has no artifact to download (status: running)" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_client_download_409_raises_api_error(api: FakeApi, tmp_path: Path) -> None:
    api.overrides[("GET", "/releases/rel-1/download")] = lambda _r: _error(
        409, "not_ready", "release rel-1 is running", {"status": "running"}
    )
    http = httpx.Client(transport=httpx.MockTransport(api.handle))
    client = Client(base_url=BASE, api_key=KEY, http=http)
    with pytest.raises(ApiError) as caught:
        client.download_release("rel-1", tmp_path / "r.npz")
    assert (caught.value.status, caught.value.code) == (409, "not_ready")
    assert caught.value.detail == {"status": "running"}
    assert list(tmp_path.iterdir()) == []


def test_download_into_unwritable_place(
    run: Callable[..., Result], api: FakeApi, tmp_path: Path
) -> None:
    api.release_states = [DONE]
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run("download", "rel-1", "--output", str(blocker / "r.npz"))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot write {blocker / 'r.npz'}")
