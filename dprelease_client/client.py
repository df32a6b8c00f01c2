"""A thin, typed client for the dprelease REST API.

It knows the endpoints and the error envelope (``{"error": {"code", "message", "detail"}}``)
and nothing about the command line: every failure surfaces as :class:`ApiError` (or its
subclass :class:`ApiConnectionError` when the server cannot be reached at all).

It depends on httpx alone: importing it loads neither numpy, pandas nor torch (a test checks
it), so a script or the CLI starts fast. :meth:`Client.to_pandas` imports pandas (and numpy,
pyarrow) only when called.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx

from dprelease_client import types as t

JSON = dict[str, Any]

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
_CHUNK = 1 << 20


class ApiError(Exception):
    """An error answer of the API (or a failure to get one)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.detail: dict[str, Any] = dict(detail or {})


class ApiConnectionError(ApiError):
    """The API could not be reached (refused, DNS, timeout, ...)."""


class ChecksumMismatch(ApiError):
    """A downloaded artifact does not hash to what the release declares."""


class WaitTimeout(ApiError):
    """:meth:`Client.wait` gave up; the release keeps running on the server.
    ``detail["release"]`` is its last state seen."""


class ReleaseFailed(ApiError):
    """:meth:`Client.wait` saw the release end ``failed`` or ``cancelled``.
    ``detail["release"]`` is its final state."""


@dataclass(frozen=True)
class Download:
    path: Path
    bytes: int
    sha256: str

    def as_json(self) -> JSON:
        return {"path": str(self.path), "bytes": self.bytes, "sha256": self.sha256}


def _error_from_response(response: httpx.Response) -> ApiError:
    """Build an :class:`ApiError` from an error response (body already read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        detail = err.get("detail")
        return ApiError(
            str(err.get("message") or f"HTTP {response.status_code}"),
            status=response.status_code,
            code=err.get("code"),
            detail=detail if isinstance(detail, dict) else None,
        )
    text = response.text.strip()
    message = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    if text:
        message = f"{message}: {text[:300]}"
    return ApiError(message, status=response.status_code)


RATE_LIMIT_RETRIES = 3
MAX_RETRY_WAIT_S = 30.0
# The API's terminal release statuses (service.releases.status; this package imports nothing
# of the service).
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _refused_unread(response: httpx.Response) -> bool:
    """An answer given before the server read the request, so resending cannot act twice:
    429 (rate limit) or 503 ``uploads_busy`` (the upload slots are full; nothing stored).
    Other 503s (``/ready`` not ready) are answers, not a request to come back."""
    if response.status_code == 429:
        return True
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") == "uploads_busy"


def _retry_after(response: httpx.Response) -> float:
    try:
        wait = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def _rewind(files: Any) -> bool:
    """Put upload streams back at their start for a resend; False if one cannot be."""
    if not files:
        return True
    for value in dict(files).values():
        stream = value[1] if isinstance(value, tuple) else value
        if not (hasattr(stream, "seekable") and stream.seekable()):
            return False
        stream.seek(0)
    return True


class Client:
    """Calls the dprelease API with a bearer key.

    ``http`` may be given to inject a preconfigured :class:`httpx.Client` (tests pass one with
    an ``httpx.MockTransport``); the client then neither owns nor closes it. Requests use
    absolute URLs built from ``base_url`` and send ``Authorization`` per request, so an injected
    client needs no base URL or headers of its own.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        http: httpx.Client | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self.sleep: Callable[[float], None] = time.sleep

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _send(
        self,
        method: str,
        path: str,
        *,
        extra_headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request, resent after a 429 or a 503 ``uploads_busy`` (both refused before the
        server read it, so resending cannot act twice) up to RATE_LIMIT_RETRIES times, waiting
        as Retry-After says."""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                response = self._http.request(
                    method,
                    self._url(path),
                    headers={**self._headers, **(extra_headers or {})},
                    **kwargs,
                )
            except httpx.TransportError as exc:
                raise self._connection_error(exc) from exc
            if not _refused_unread(response) or attempt == RATE_LIMIT_RETRIES:
                return response
            if not _rewind(kwargs.get("files")):
                return response
            self.sleep(_retry_after(response))
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if response.is_error:
            raise _error_from_response(response)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                f"unexpected non-JSON answer from {method} {path} (HTTP {response.status_code})",
                status=response.status_code,
            ) from exc

    def _connection_error(self, exc: httpx.TransportError) -> ApiConnectionError:
        reason = str(exc) or type(exc).__name__
        return ApiConnectionError(f"cannot reach the API at {self.base_url}: {reason}")

    # -- identity & keys -------------------------------------------------------------------

    def create_api_key(
        self,
        *,
        name: str | None = None,
        role: str | None = None,
        principal_id: str | None = None,
        expires_in: int | None = None,
    ) -> t.ApiKeyCreated:
        fields = {
            "name": name,
            "role": role,
            "principal_id": principal_id,
            "expires_in": expires_in,
        }
        body = {k: v for k, v in fields.items() if v is not None}
        result: t.ApiKeyCreated = self._request("POST", "/api-keys", json=body)
        return result

    def list_api_keys(self) -> t.ApiKeyList:
        result: t.ApiKeyList = self._request("GET", "/api-keys")
        return result

    def revoke_api_key(self, key_id: str) -> None:
        self._request("DELETE", f"/api-keys/{_seg(key_id)}")

    def me(self) -> t.Me:
        result: t.Me = self._request("GET", "/me")
        return result

    # -- datasets --------------------------------------------------------------------------

    def upload_dataset(
        self,
        file: BinaryIO,
        *,
        filename: str,
        metadata: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> t.Dataset:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: t.Dataset = self._request(
            "POST",
            "/datasets",
            files={"file": (filename, file, "application/octet-stream")},
            data={"metadata": json.dumps(dict(metadata))},
            timeout=httpx.Timeout(None, connect=10.0),
            extra_headers=headers,
        )
        return result

    def list_datasets(self) -> t.DatasetList:
        result: t.DatasetList = self._request("GET", "/datasets")
        return result

    def get_dataset(self, dataset_id: str) -> t.Dataset:
        result: t.Dataset = self._request("GET", f"/datasets/{_seg(dataset_id)}")
        return result

    def grant(self, dataset_id: str, principal_id: str) -> t.Grant:
        result: t.Grant = self._request(
            "POST", f"/datasets/{_seg(dataset_id)}/grants", json={"principal_id": principal_id}
        )
        return result

    def list_grants(self, dataset_id: str) -> t.GrantList:
        result: t.GrantList = self._request("GET", f"/datasets/{_seg(dataset_id)}/grants")
        return result

    def revoke_grant(self, dataset_id: str, grant_id: str) -> None:
        self._request("DELETE", f"/datasets/{_seg(dataset_id)}/grants/{_seg(grant_id)}")

    def delete_dataset(self, dataset_id: str) -> t.Dataset:
        result: t.Dataset = self._request("DELETE", f"/datasets/{_seg(dataset_id)}")
        return result

    # -- releases --------------------------------------------------------------------------

    def create_release(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> t.Release:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: t.Release = self._request(
            "POST", "/releases", json=dict(body), extra_headers=headers
        )
        return result

    def preview_release(self, body: Mapping[str, Any]) -> t.Preview:
        result: t.Preview = self._request("POST", "/releases/preview", json=dict(body))
        return result

    def list_releases(self, *, dataset_id: str | None = None) -> t.ReleaseList:
        params = {"dataset_id": dataset_id} if dataset_id is not None else None
        result: t.ReleaseList = self._request("GET", "/releases", params=params)
        return result

    def get_release(self, release_id: str) -> t.Release:
        result: t.Release = self._request("GET", f"/releases/{_seg(release_id)}")
        return result

    def cancel_release(self, release_id: str) -> t.Release:
        result: t.Release = self._request("POST", f"/releases/{_seg(release_id)}/cancel")
        return result

    def download_release(
        self,
        release_id: str,
        output: Path,
        *,
        expected_sha256: str | None = None,
        artifact: str | None = None,
    ) -> Download:
        """Stream the artifact (or the further file named ``artifact``) to ``output``
        atomically (temp file in the same directory, then rename), following a redirect to a
        presigned URL if the API answers with one.

        httpx drops ``Authorization`` when a redirect leaves the API's origin, so the key is
        never sent to the object store. With ``expected_sha256`` the file is only moved into
        place if it matches; otherwise :class:`ChecksumMismatch` is raised and nothing is left.
        """
        what = "download" if artifact is None else f"artifacts/{_seg(artifact)}"
        return self._download_to(
            f"/releases/{_seg(release_id)}/{what}",
            Path(output),
            release_id,
            expected_sha256=expected_sha256,
        )

    def _download_to(
        self, path: str, output: Path, release_id: str, *, expected_sha256: str | None = None
    ) -> Download:
        output = Path(output)
        directory = output.parent if str(output.parent) else Path(".")
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=directory)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as sink:
                digest, size = self._stream_to(path, sink)
                sink.flush()
                os.fsync(sink.fileno())
            if expected_sha256 is not None and digest != expected_sha256.lower():
                raise ChecksumMismatch(
                    f"checksum mismatch for release {release_id}: downloaded {size} bytes "
                    f"hashing to {digest}, the release declares {expected_sha256}",
                    detail={"expected_sha256": expected_sha256, "actual_sha256": digest},
                )
            os.replace(tmp, output)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return Download(path=output, bytes=size, sha256=digest)

    def _stream_to(self, path: str, sink: BinaryIO) -> tuple[str, int]:
        hasher = hashlib.sha256()
        size = 0
        try:
            with self._http.stream(
                "GET",
                self._url(path),
                headers=self._headers,
                follow_redirects=True,
                timeout=httpx.Timeout(60.0, connect=10.0),
            ) as response:
                if response.is_error:
                    response.read()
                    raise _error_from_response(response)
                for chunk in response.iter_bytes(_CHUNK):
                    hasher.update(chunk)
                    sink.write(chunk)
                    size += len(chunk)
        except httpx.TooManyRedirects as exc:
            raise ApiError(f"too many redirects downloading {path}") from exc
        except httpx.TransportError as exc:
            raise self._connection_error(exc) from exc
        return hasher.hexdigest(), size

    # -- budgets ---------------------------------------------------------------------------

    def list_budgets(self) -> t.BudgetList:
        result: t.BudgetList = self._request("GET", "/budgets")
        return result

    def get_budget(self, dataset_id: str) -> t.Ledger:
        result: t.Ledger = self._request("GET", f"/budgets/{_seg(dataset_id)}")
        return result

    # -- the rest of the API ---------------------------------------------------------------

    def upload_file(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> t.Dataset:
        """:meth:`upload_dataset` from a file on disk (npz, csv or parquet)."""
        source = Path(path)
        with source.open("rb") as fh:
            return self.upload_dataset(
                fh, filename=source.name, metadata=metadata, idempotency_key=idempotency_key
            )

    def list_mechanisms(self) -> t.MechanismList:
        result: t.MechanismList = self._request("GET", "/mechanisms")
        return result

    def list_audit_events(
        self,
        *,
        object_type: str | None = None,
        object_id: str | None = None,
        actor: str | None = None,
        since: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> t.AuditPage:
        fields = {
            "object_type": object_type,
            "object_id": object_id,
            "actor": actor,
            "since": since,
            "cursor": cursor,
            "limit": limit,
        }
        params = {k: v for k, v in fields.items() if v is not None}
        result: t.AuditPage = self._request("GET", "/audit", params=params or None)
        return result

    def get_report(self, release_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/releases/{_seg(release_id)}/report")
        return result

    def health(self) -> t.Health:
        result: t.Health = self._request("GET", "/health")
        return result

    def ready(self) -> t.Readiness:
        """Readiness; a server that is not ready answers 503, raised as :class:`ApiError`
        (``detail`` carries its checks)."""
        result: t.Readiness = self._request("GET", "/ready")
        return result

    def download_raw(self, release_id: str, output: Path) -> Download:
        """The owner's raw rows of a release (GET /releases/{id}/raw), streamed to ``output``."""
        return self._download_to(f"/releases/{_seg(release_id)}/raw", Path(output), release_id)

    def download(
        self,
        release_id: str,
        output: str | os.PathLike[str] | None = None,
        *,
        artifact: str | None = None,
    ) -> Path | bytes:
        """The release's artifact (or its further file ``artifact``), checked against the
        sha256 the release declares: written to ``output`` (returns the path), or returned as
        bytes when ``output`` is None. Raises :class:`ApiError` if the release has no such
        file yet (not succeeded)."""
        release = self.get_release(release_id)
        expected = _declared_sha256(release, artifact)
        if output is not None:
            return self.download_release(
                release_id, Path(output), expected_sha256=expected, artifact=artifact
            ).path
        with tempfile.TemporaryDirectory(prefix="dprelease-") as scratch:
            path = Path(scratch) / "artifact"
            self.download_release(release_id, path, expected_sha256=expected, artifact=artifact)
            return path.read_bytes()

    # -- waiting ---------------------------------------------------------------------------

    def wait(
        self,
        release_id: str,
        *,
        timeout: float | None = None,
        poll: float = 1.0,
        max_poll: float = 10.0,
        backoff: float = 1.5,
        first_poll: float = 0.1,
        progress: bool | Callable[[t.Release], None] = False,
        check: bool = True,
    ) -> t.Release:
        """Poll the release until it is succeeded, failed or cancelled and return it.

        The first poll comes ``first_poll`` seconds after the first look (at most ``poll``):
        a release that takes a second is seen done within a fraction of it. Each further
        interval is ``backoff`` times the last, at most ``poll`` while the job moves (status,
        progress or phase changed) and at most ``max_poll`` while nothing moves (a long DPGM
        training is not polled every second for an hour). ``progress`` is a callback given
        each state seen, or True for a bar on stderr (tqdm when importable, else a line per
        change). With ``check`` a failed
        or cancelled release raises :class:`ReleaseFailed`; after ``timeout`` seconds
        :class:`WaitTimeout` is raised (the release keeps running on the server).
        """
        report = _progress_reporter(release_id, progress)
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = min(first_poll, poll) / backoff  # the first wait is min(first_poll, poll)
        last: Any = None
        try:
            while True:
                release = self.get_release(release_id)
                report(release)
                status = release.get("status")
                if status in TERMINAL_STATUSES:
                    break
                moved = (status, release.get("progress"), release.get("phase"))
                interval = min(interval * backoff, poll if moved != last else max_poll)
                last = moved
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise WaitTimeout(
                        f"timed out after {timeout:g}s waiting for release {release_id} "
                        f"(status: {status}); it keeps running on the server",
                        detail={"release": dict(release)},
                    )
                self.sleep(interval if deadline is None else min(interval, deadline - now))
        finally:
            report(None)
        if check and status != "succeeded":
            error = release.get("error")
            reason = error.get("message") if isinstance(error, dict) else None
            raise ReleaseFailed(
                f"release {release_id} {status}" + (f": {reason}" if reason else ""),
                code=f"release_{status}",
                detail={"release": dict(release)},
            )
        return release

    # -- pandas ----------------------------------------------------------------------------

    def to_pandas(self, release: str | os.PathLike[str], *, artifact: str | None = None) -> Any:
        """A release as a ``pandas.DataFrame``: ``release`` is a path to a downloaded artifact
        (NPZ, CSV or Parquet) or a release id (downloaded, checksum verified, to a temporary
        file). Columns as in the CSV/Parquet artifacts: the dataset's feature names, then its
        label column (``read_release``); pandas (and numpy, pyarrow for Parquet) are imported
        only here."""
        if isinstance(release, os.PathLike) or Path(str(release)).is_file():
            return read_release(Path(release))
        with tempfile.TemporaryDirectory(prefix="dprelease-") as scratch:
            path = Path(scratch) / "artifact"
            content = self.download(str(release), path, artifact=artifact)
            return read_release(Path(content) if not isinstance(content, bytes) else path)


def _seg(value: str) -> str:
    """Quote one path segment so an id can never change the path."""
    return quote(str(value), safe="")


def _declared_sha256(release: Mapping[str, Any], artifact: str | None) -> str:
    release_id = release.get("id")
    if artifact is None:
        declared = release.get("artifact")
        sha = declared.get("sha256") if isinstance(declared, dict) else None
    else:
        further = [a for a in release.get("artifacts") or () if a.get("name") == artifact]
        sha = further[0].get("sha256") if further else None
    if not sha:
        raise ApiError(
            f"release {release_id} has no artifact"
            + (f" named {artifact!r}" if artifact else "")
            + f" to download (status: {release.get('status')})",
            detail={"status": release.get("status")},
        )
    return str(sha)


def _progress_reporter(
    release_id: str, progress: bool | Callable[[t.Release], None]
) -> Callable[[t.Release | None], None]:
    """``report(release)`` per state seen, ``report(None)`` once at the end."""
    if callable(progress):
        callback = progress
        return lambda release: None if release is None else callback(release)
    if not progress:
        return lambda release: None
    import sys

    try:
        from tqdm import tqdm
    except ImportError:  # a line on stderr per change, without tqdm
        seen: list[str] = []

        def line(release: t.Release | None) -> None:
            if release is None:
                return
            text = _describe(release)
            if not seen or seen[-1] != text:
                seen.append(text)
                print(f"release {release_id}: {text}", file=sys.stderr, flush=True)

        return line
    bar = tqdm(
        total=100,
        desc=f"release {release_id}",
        file=sys.stderr,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]{postfix}",
        dynamic_ncols=True,
    )

    def show(release: t.Release | None) -> None:
        if release is None:
            bar.close()
            return
        bar.n = round(_fraction(release) * 100)
        bar.set_postfix_str(_describe(release), refresh=False)
        bar.refresh()

    return show


def _fraction(release: Mapping[str, Any]) -> float:
    progress = release.get("progress")
    fraction = float(progress) if isinstance(progress, int | float) else 0.0
    if release.get("status") == "succeeded":
        fraction = 1.0
    return min(max(fraction, 0.0), 1.0)


def _describe(release: Mapping[str, Any]) -> str:
    status = release.get("status")
    phase = release.get("phase")
    # The phase is the job's word for its current step (rows written, training epochs, ...).
    return f"{status}: {phase}" if phase and status == "running" else str(status)


def read_release(path: Path) -> Any:
    """A release artifact file as a DataFrame, its format told by its first bytes (NPZ is a
    zip, Parquet starts ``PAR1``, else CSV), so a file named anything reads. Columns as the
    release's CSV/Parquet tables have them: the dataset's feature names, then its label
    column (the class, for mechanisms with exact labels) or ``<label>=<class>`` columns (class
    proportions, or signed values); the NPZ's metadata names them (``layout``)."""
    import pandas as pd

    with Path(path).open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PAR1":
        return pd.read_parquet(path)
    if magic[:2] != b"PK":
        return pd.read_csv(path)
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(str(arrays["metadata"])) if "metadata" in arrays else {}
    X = np.asarray(arrays["X"]).reshape(len(arrays["X"]), -1)
    Y = np.asarray(arrays["y"]).reshape(len(arrays["y"]), -1)
    classes = metadata.get("classes") or []
    layout = metadata.get("layout")
    if isinstance(layout, dict) and len(layout.get("feature_columns", ())) == X.shape[1]:
        frame = pd.DataFrame(X, columns=list(layout["feature_columns"]))
        if layout.get("label_kind") == "exact" and len(classes) == Y.shape[1]:
            # The NPZ holds one-hot rows: the class at each row's 1.
            frame[layout["label_column"]] = pd.Series(
                [classes[i] for i in Y.argmax(axis=1)], index=frame.index
            )
        else:
            for j, name in enumerate(layout["label_columns"]):
                frame[name] = Y[:, j]
        frame.attrs["dprelease"] = metadata
        return frame
    # A release made before layouts: x_<feature>, y_<class> as its tables had them.
    names = metadata.get("feature_names") or []
    x_cols = [f"x_{n}" for n in names] if len(names) == X.shape[1] else None
    y_cols = [f"y_{c}" for c in classes] if len(classes) == Y.shape[1] else None
    x_cols = x_cols or [f"x_{i}" for i in range(X.shape[1])]
    y_cols = y_cols or [f"y_{j}" for j in range(Y.shape[1])]
    frame = pd.DataFrame(np.hstack([X, Y]), columns=[*x_cols, *y_cols])
    frame.attrs["dprelease"] = metadata
    return frame
