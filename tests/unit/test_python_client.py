"""dprelease_client on its own: a light import, the 503 uploads_busy retry, wait() and
to_pandas(), against an httpx.MockTransport (the end-to-end run is
tests/integration/test_python_client.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from dprelease_client import ApiError, Client, ReleaseFailed, WaitTimeout, read_release
from dprelease_client.transport import RATE_LIMIT_RETRIES

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://api.test"


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after ``statement``."""
    code = f"import sys; {statement}; print(' '.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_importing_the_client_loads_no_numpy_pandas_or_torch() -> None:
    assert _loaded_after("import dprelease_client", ("torch", "numpy", "pandas", "pyarrow")) == []


def test_importing_the_cli_loads_no_torch_numpy_or_dpcore() -> None:
    heavy = ("torch", "numpy", "pandas", "scipy", "sklearn", "dpcore")
    assert _loaded_after("import dprelease_cli.main", heavy) == []


def test_the_lazy_evaluate_command_is_listed_with_its_own_short_help() -> None:
    import click

    from dprelease_cli.evaluate_cmd import evaluate_command
    from dprelease_cli.main import _LAZY_COMMANDS, cli

    _, _, listed = _LAZY_COMMANDS["evaluate"]
    assert click.Command("evaluate", help=listed).get_short_help_str(200) == (
        evaluate_command.get_short_help_str(200)
    )
    ctx = click.Context(cli)
    assert cli.get_command(ctx, "evaluate") is evaluate_command


def test_the_cli_default_mechanism_is_the_one_the_records_study_measures_best() -> None:
    from dpcore.mechanisms import recommend, registry
    from dprelease_cli.main import DEFAULT_MECHANISM

    assert registry.get(DEFAULT_MECHANISM).guidance.kind == "mechanism"
    # On MNIST, where every served mechanism of the study was measured (its table rows count
    # only for mechanisms the tabular study lacks).
    measured = [
        e
        for e in recommend.table()
        if e.source.endswith("records_study.csv") and e.dataset == "mnist"
    ]
    assert {e.epsilon for e in measured} >= {1.0, 10.0}
    for epsilon in {e.epsilon for e in measured}:
        mine = [e for e in measured if e.epsilon == epsilon]
        assert max(mine, key=lambda e: e.score).mechanism == DEFAULT_MECHANISM


def test_the_standalone_packaging_depends_on_httpx_only() -> None:
    meta = tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())
    assert [d.split(">")[0] for d in meta["project"]["dependencies"]] == ["httpx"]
    include = meta["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for source in include:
        assert (ROOT / "clients/python" / source).resolve() == ROOT / "dprelease_client"


def _busy() -> httpx.Response:
    body = {"error": {"code": "uploads_busy", "message": "busy", "detail": {}}}
    return httpx.Response(503, json=body, headers={"Retry-After": "5"})


def _client(handler: Any) -> tuple[Client, list[float]]:
    client = Client(
        base_url=BASE, api_key="k", http=httpx.Client(transport=httpx.MockTransport(handler))
    )
    waits: list[float] = []
    client.sleep = waits.append  # type: ignore[method-assign]
    return client, waits


def test_an_upload_refused_503_uploads_busy_is_sent_again_after_retry_after() -> None:
    bodies: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.read())
        return _busy() if len(bodies) < 3 else httpx.Response(201, json={"id": "ds-1"})

    client, waits = _client(handler)
    dataset = client.upload_dataset(
        io.BytesIO(b"a,b\n1,2\n"), filename="d.csv", metadata={"name": "d"}
    )
    assert dataset == {"id": "ds-1"}
    assert waits == [5.0, 5.0]
    # The whole file each time (the stream is rewound before a resend).
    assert len(bodies) == 3 and all(b"a,b\n1,2\n" in b for b in bodies)


def test_uploads_busy_gives_up_after_the_retries() -> None:
    client, waits = _client(lambda request: _busy())
    with pytest.raises(ApiError) as caught:
        client.upload_dataset(io.BytesIO(b"x"), filename="d.npz", metadata={})
    assert caught.value.status == 503 and caught.value.code == "uploads_busy"
    assert len(waits) == RATE_LIMIT_RETRIES


def test_a_503_not_ready_is_an_answer_not_retried() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "not_ready", "message": "db down", "detail": {}}}
        return httpx.Response(503, json=body, headers={"Retry-After": "1"})

    client, waits = _client(handler)
    with pytest.raises(ApiError) as caught:
        client.ready()
    assert caught.value.status == 503 and waits == []


def _releases(states: list[dict[str, Any]]) -> Any:
    seen = iter(states)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/releases/rel-1"
        return httpx.Response(200, json={"id": "rel-1", **next(seen)})

    return handler


def test_wait_backs_off_while_nothing_moves_and_reports_each_state() -> None:
    states = [
        {"status": "queued", "progress": 0.0},
        {"status": "queued", "progress": 0.0},
        {"status": "queued", "progress": 0.0},
        {"status": "running", "progress": 0.5, "phase": "epoch 1/2"},
        {"status": "running", "progress": 0.5, "phase": "epoch 1/2"},
        {"status": "succeeded", "progress": 1.0},
    ]
    client, waits = _client(_releases(states))
    seen: list[dict[str, Any]] = []
    final = client.wait(
        "rel-1", poll=1.0, max_poll=2.0, backoff=1.5, first_poll=1.0, progress=seen.append
    )
    assert final["status"] == "succeeded"
    assert [s["status"] for s in seen] == [s["status"] for s in states]
    # Backoff 1 → 1.5 → 2 (capped) while queued; back to 1 when the job moves.
    assert waits == [1.0, 1.5, 2.0, 1.0, 1.5]


def test_wait_looks_again_soon_then_backs_off_to_the_poll_while_the_job_moves() -> None:
    # A job that takes about a second is seen done a fraction of a second after it ends:
    # the first polls come 0.1 s apart and grow, capped at `poll` while the job moves and at
    # `max_poll` once it stalls.
    states = [
        {"status": "queued", "progress": 0.0},
        {"status": "running", "progress": 0.1},
        {"status": "running", "progress": 0.2},
        {"status": "running", "progress": 0.3},
        {"status": "running", "progress": 0.4},
        {"status": "running", "progress": 0.5},
        {"status": "running", "progress": 0.6},
        {"status": "running", "progress": 0.6},
        {"status": "running", "progress": 0.6},
        {"status": "running", "progress": 0.6},
        {"status": "succeeded", "progress": 1.0},
    ]
    client, waits = _client(_releases(states))
    client.wait("rel-1", poll=1.0, max_poll=3.0, backoff=2.0)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 2.0, 3.0, 3.0]


def test_wait_raises_on_failure_unless_told_not_to() -> None:
    failed = {"status": "failed", "error": {"code": "job_failed", "message": "boom"}}
    client, _ = _client(_releases([failed]))
    with pytest.raises(ReleaseFailed, match="boom") as caught:
        client.wait("rel-1")
    assert caught.value.detail["release"]["status"] == "failed"
    client, _ = _client(_releases([failed]))
    assert client.wait("rel-1", check=False)["status"] == "failed"


def test_wait_times_out_with_the_last_state() -> None:
    client, _ = _client(_releases([{"status": "running", "progress": 0.3}]))
    with pytest.raises(WaitTimeout, match="keeps running") as caught:
        client.wait("rel-1", timeout=0)
    assert caught.value.detail["release"]["progress"] == 0.3


def test_wait_progress_true_draws_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    client, _ = _client(_releases([{"status": "running"}, {"status": "succeeded"}]))
    client.wait("rel-1", progress=True)
    assert "release rel-1" in capsys.readouterr().err


def _npz(X: np.ndarray, y: np.ndarray, metadata: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y, metadata=np.array(json.dumps(metadata)))
    return buffer.getvalue()


def test_read_release_npz_made_before_layouts_keeps_its_old_names(tmp_path: Path) -> None:
    X = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.eye(3, dtype=np.float32)
    path = tmp_path / "release.bin"  # the format is told by content, not by name
    path.write_bytes(_npz(X, y, {"feature_names": ["age", "income"], "classes": [0, 1, 2]}))
    frame = read_release(path)
    assert list(frame.columns) == ["x_age", "x_income", "y_0", "y_1", "y_2"]
    np.testing.assert_array_equal(frame.to_numpy()[:, :2], X)
    assert frame.attrs["dprelease"]["classes"] == [0, 1, 2]


@pytest.mark.parametrize("kind", ["exact", "proportions", "combinations"])
def test_read_release_npz_names_columns_as_the_tabular_formats(tmp_path: Path, kind: str) -> None:
    """An NPZ and a Parquet release of the same rows read into the same frame: the dataset's
    feature names, then its label column (the class) or '<label>=<class>' columns."""
    from dpcore.artifacts import ArtifactWriter
    from dpcore.release_layout import Layout

    X = np.arange(6, dtype=np.float32).reshape(3, 2)
    Y = (
        np.eye(2, dtype=np.float32)[[0, 1, 1]]
        if kind == "exact"
        else np.array([[0.5, -0.25], [2.0, 2.0], [-1.0, -1.0]], dtype=np.float32)
    )
    layout = Layout.of(["age", "ward=A"], "outcome", kind, ["no", "yes"])  # type: ignore[arg-type]
    frames = []
    for fmt in ("npz", "parquet"):
        path = tmp_path / f"release.{fmt}"
        meta = {"mechanism": "m", "classes": ["no", "yes"]}
        with ArtifactWriter(fmt, path, rows=3, layout=layout, metadata=meta) as writer:
            writer.write(X, Y)
        frames.append(read_release(path))
    npz, parquet = frames
    labels = ["outcome"] if kind == "exact" else ["outcome=no", "outcome=yes"]
    assert list(npz.columns) == list(parquet.columns) == ["age", "ward=A", *labels]
    pd.testing.assert_frame_equal(npz, parquet, check_dtype=False)
    if kind == "exact":
        assert npz["outcome"].tolist() == ["no", "yes", "yes"]
    assert npz.attrs["dprelease"]["layout"]["label_kind"] == kind


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_read_release_tabular(tmp_path: Path, fmt: str) -> None:
    frame = pd.DataFrame({"a": [0.5, 1.5], "label=0": [1.0, 0.0], "label=1": [0.0, 1.0]})
    path = tmp_path / f"release.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    pd.testing.assert_frame_equal(read_release(path), frame)


def test_to_pandas_downloads_a_release_id_checked_against_its_sha(tmp_path: Path) -> None:
    import hashlib

    content = _npz(np.ones((2, 1)), np.ones((2, 1)), {"feature_names": ["f"], "classes": [1]})
    sha = hashlib.sha256(content).hexdigest()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/releases/rel-1":
            return httpx.Response(200, json={"id": "rel-1", "artifact": {"sha256": sha}})
        assert request.url.path == "/releases/rel-1/download"
        return httpx.Response(200, content=content)

    client, _ = _client(handler)
    frame = client.to_pandas("rel-1")
    assert list(frame.columns) == ["x_f", "y_1"] and len(frame) == 2
    assert client.download("rel-1") == content
