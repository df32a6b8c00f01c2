"""A thin, typed client for the dprelease REST API.

It knows the endpoints and the error envelope (``{"error": {"code", "message", "detail"}}``)
and nothing about the command line: every failure surfaces as :class:`ApiError` (or its
subclass :class:`ApiConnectionError` when the server cannot be reached at all).

It depends on httpx alone: importing it loads neither numpy, pandas nor torch (a test checks
it), so a script or the CLI starts fast. :meth:`Client.to_pandas` imports pandas (and numpy,
pyarrow) only when called.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from dprelease_client import types as t
from dprelease_client.errors import ApiError, ReleaseFailed, WaitTimeout
from dprelease_client.frames import read_release
from dprelease_client.progress import progress_reporter
from dprelease_client.transport import Download, Transport, seg

# The API's terminal release statuses (service.releases.status; this package imports nothing
# of the service).
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# The further file beside a CSV release that holds its metadata (NPZ and Parquet embed it).
METADATA = "metadata.json"


class Client(Transport):
    """Calls the dprelease API with a bearer key.

    ``http`` may be given to inject a preconfigured :class:`httpx.Client` (tests pass one with
    an ``httpx.MockTransport``); the client then neither owns nor closes it. Requests use
    absolute URLs built from ``base_url`` and send ``Authorization`` per request, so an injected
    client needs no base URL or headers of its own.
    """

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
        self._request("DELETE", f"/api-keys/{seg(key_id)}")

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
        result: t.Dataset = self._request("GET", f"/datasets/{seg(dataset_id)}")
        return result

    def grant(self, dataset_id: str, principal_id: str) -> t.Grant:
        result: t.Grant = self._request(
            "POST", f"/datasets/{seg(dataset_id)}/grants", json={"principal_id": principal_id}
        )
        return result

    def list_grants(self, dataset_id: str) -> t.GrantList:
        result: t.GrantList = self._request("GET", f"/datasets/{seg(dataset_id)}/grants")
        return result

    def revoke_grant(self, dataset_id: str, grant_id: str) -> None:
        self._request("DELETE", f"/datasets/{seg(dataset_id)}/grants/{seg(grant_id)}")

    def delete_dataset(self, dataset_id: str) -> t.Dataset:
        result: t.Dataset = self._request("DELETE", f"/datasets/{seg(dataset_id)}")
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
        result: t.Release = self._request("GET", f"/releases/{seg(release_id)}")
        return result

    def cancel_release(self, release_id: str) -> t.Release:
        result: t.Release = self._request("POST", f"/releases/{seg(release_id)}/cancel")
        return result

    def download_release(
        self,
        release_id: str,
        output: Path,
        *,
        expected_sha256: str | None = None,
        artifact: str | None = None,
        format: str | None = None,
    ) -> Download:
        """Stream the artifact (or the further file named ``artifact``) to ``output``
        atomically (temp file in the same directory, then rename), following a redirect to a
        presigned URL if the API answers with one. ``format``: the artifact in another file
        format than the release's own (csv, parquet, npz), converted by the server.

        httpx drops ``Authorization`` when a redirect leaves the API's origin, so the key is
        never sent to the object store. With ``expected_sha256`` the file is only moved into
        place if it matches; otherwise :class:`ChecksumMismatch` is raised and nothing is left.
        """
        what = "download" if artifact is None else f"artifacts/{seg(artifact)}"
        if format is not None and artifact is None:
            what += f"?format={seg(format)}"
        return self._download_to(
            f"/releases/{seg(release_id)}/{what}",
            Path(output),
            release_id,
            expected_sha256=expected_sha256,
        )

    # -- budgets ---------------------------------------------------------------------------

    def list_budgets(self) -> t.BudgetList:
        result: t.BudgetList = self._request("GET", "/budgets")
        return result

    def get_budget(self, dataset_id: str) -> t.Ledger:
        result: t.Ledger = self._request("GET", f"/budgets/{seg(dataset_id)}")
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
        result: dict[str, Any] = self._request("GET", f"/releases/{seg(release_id)}/report")
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
        return self._download_to(f"/releases/{seg(release_id)}/raw", Path(output), release_id)

    def download(
        self,
        release_id: str,
        output: str | os.PathLike[str] | None = None,
        *,
        artifact: str | None = None,
        format: str | None = None,
    ) -> Path | bytes:
        """The release's artifact (or its further file ``artifact``), checked against the
        sha256 the release declares: written to ``output`` (returns the path), or returned as
        bytes when ``output`` is None. ``format``: the artifact in another file format
        (csv, parquet, npz), converted by the server (no sha256 is declared for a conversion:
        it is not checked). Raises :class:`ApiError` if the release has no such file yet (not
        succeeded)."""
        release = self.get_release(release_id)
        converted = artifact is None and format not in (None, release.get("format"))
        served_anyway = artifact == METADATA  # every release's metadata, listed or not
        expected = None
        if not converted and not (served_anyway and not _has_artifact(release, METADATA)):
            expected = _declared_sha256(release, artifact)
        args: dict[str, Any] = {
            "expected_sha256": expected,
            "artifact": artifact,
            "format": format if converted else None,
        }
        if output is not None:
            return self.download_release(release_id, Path(output), **args).path
        with tempfile.TemporaryDirectory(prefix="dprelease-") as scratch:
            path = Path(scratch) / "artifact"
            self.download_release(release_id, path, **args)
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
        report = progress_reporter(release_id, progress)
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

    def to_pandas(
        self,
        release: str | os.PathLike[str],
        *,
        artifact: str | None = None,
        format: str | None = None,
    ) -> Any:
        """A release as a ``pandas.DataFrame``: ``release`` is a path to a downloaded artifact
        (NPZ, CSV or Parquet) or a release id (downloaded, checksum verified, to a temporary
        file; in ``format`` when given, converted by the server). A release of a declared
        table is that table (its columns, types, categories and missing values); otherwise
        the dataset's feature names, then its label column (``read_release``).
        ``df.attrs["dprelease"]`` holds the release's metadata (for a CSV by id, its
        ``metadata.json``, fetched too). pandas (and numpy, pyarrow for Parquet) are imported
        only here."""
        if isinstance(release, os.PathLike) or Path(str(release)).is_file():
            return read_release(Path(release))
        with tempfile.TemporaryDirectory(prefix="dprelease-") as scratch:
            path = Path(scratch) / "artifact"
            self.download(str(release), path, artifact=artifact, format=format)
            metadata = None
            fmt = format or self.get_release(str(release)).get("format")
            if artifact is None and fmt == "csv":
                content = self.download(str(release), artifact=METADATA)
                assert isinstance(content, bytes)  # no output path: the bytes
                metadata = json.loads(content)
            return read_release(path, metadata)


def _has_artifact(release: Mapping[str, Any], name: str) -> bool:
    return any(a.get("name") == name for a in release.get("artifacts") or ())


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
