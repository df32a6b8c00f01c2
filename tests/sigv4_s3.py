"""A signature-checking S3 server for the tests: moto behind a hand-written AWS Signature
Version 4 verifier.

moto's server stores and serves objects faithfully but checks no signature (not the
Authorization header unless its IAM mode is on, never a presigned URL's signature or expiry),
so a download URL signed for the wrong key, with the wrong secret or past its lifetime would
pass the tests. MinIO, which does check, is not installable here (no Debian or PyPI server
package, no network), so this module puts a WSGI middleware in front of moto's WSGI app that
verifies every request against one configured access key and secret, as S3 does:

- ``Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`` with
  ``x-amz-date`` (clock skew ≤ 15 minutes) and ``x-amz-content-sha256``: a hex hash is checked
  against the body; ``UNSIGNED-PAYLOAD`` and the ``STREAMING-…`` markers are signed as given;
- presigned query strings (``X-Amz-Algorithm``, ``X-Amz-Credential``, ``X-Amz-Date``,
  ``X-Amz-Expires`` enforced against the server clock, ``X-Amz-SignedHeaders``,
  ``X-Amz-Signature``), payload ``UNSIGNED-PAYLOAD``;
- anything else (no signature, another algorithm) is refused.

Refusals are S3's 403 XML errors: ``InvalidAccessKeyId``, ``SignatureDoesNotMatch`` (also for
a credential scope naming another region, service or day), ``AccessDenied`` ("Request has
expired", or no signature at all). The signature is computed here with hmac/hashlib from the
AWS specification, independently of botocore (which signs the requests under test), and
compared in constant time. The clock is the verifier's own (``offset`` seconds ahead of the
wall clock) so tests can expire a URL without sleeping.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import re
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape

from werkzeug.serving import BaseWSGIServer, make_server

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60
MAX_EXPIRES_S = 7 * 24 * 3600
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Payload markers signed as given instead of the body's hash (S3's own list).
PAYLOAD_MARKERS = {
    "UNSIGNED-PAYLOAD",
    "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
}
_AUTH_HEADER = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-f]+)\s*$"
)
_DATE = re.compile(r"^\d{8}T\d{6}Z$")

StartResponse = Callable[..., Any]


class Refused(Exception):
    def __init__(self, code: str, message: str, status: str = "403 Forbidden") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _uri_encode(value: str) -> str:
    return quote(value, safe="-_.~")


def canonical_query(raw_query: str, *, drop: str | None = None) -> str:
    """Every parameter name and value URI-encoded once (RFC 3986 unreserved characters kept),
    sorted by name then value; ``drop`` (the signature itself) left out."""
    pairs = []
    for item in raw_query.split("&") if raw_query else ():
        name, _, value = item.partition("=")
        name, value = unquote(name), unquote(value)
        if name == drop:
            continue
        pairs.append((_uri_encode(name), _uri_encode(value)))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    headers = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").lower()] = value
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers[key.replace("_", "-").lower()] = environ[key]
    return headers


def _amz_time(stamp: str) -> float:
    if not _DATE.match(stamp):
        raise Refused("AccessDenied", f"malformed X-Amz-Date {stamp!r}")
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


class SigV4Verifier:
    """WSGI middleware: forwards to ``app`` only requests signed with ``access_key`` and
    ``secret_key`` for ``region`` and service ``s3``."""

    def __init__(
        self,
        app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
        *,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        service: str = "s3",
    ) -> None:
        self.app = app
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.service = service
        self.offset = 0.0  # seconds the verifier's clock runs ahead of the wall clock
        self.refusals: list[str] = []  # codes of refused requests, oldest first
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.time() + self.offset

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            self.verify(environ)
        except Refused as refused:
            with self._lock:
                self.refusals.append(refused.code)
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
                f"<Code>{refused.code}</Code><Message>{escape(refused.message)}</Message>"
                "</Error>"
            ).encode()
            start_response(
                refused.status,
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return self.app(environ, start_response)

    # -- verification ----------------------------------------------------------------------

    def verify(self, environ: dict[str, Any]) -> None:
        headers = _headers(environ)
        raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI")
        if raw_uri is None:  # not werkzeug's server: rebuild the path as it was sent
            raw_uri = quote(environ.get("PATH_INFO", ""), safe="/~")
            if environ.get("QUERY_STRING"):
                raw_uri += "?" + environ["QUERY_STRING"]
        path, _, raw_query = raw_uri.partition("?")
        query = {
            unquote(k): unquote(v)
            for k, _, v in (p.partition("=") for p in raw_query.split("&") if p)
        }
        method = environ["REQUEST_METHOD"].upper()
        if "authorization" in headers:
            self._verify_header(environ, method, path, raw_query, headers)
        elif "X-Amz-Signature" in query or "X-Amz-Algorithm" in query:
            self._verify_query(method, path, raw_query, query, headers)
        else:
            raise Refused("AccessDenied", "Access Denied (the request is not signed)")

    def _check_credential(self, credential: str, stamp: str) -> str:
        parts = credential.split("/")
        if len(parts) != 5:
            raise Refused("AccessDenied", f"malformed credential {credential!r}")
        key, day, region, service, terminator = parts
        if key != self.access_key:
            raise Refused(
                "InvalidAccessKeyId",
                "The AWS Access Key Id you provided does not exist in our records.",
            )
        if (day, region, service, terminator) != (
            stamp[:8],
            self.region,
            self.service,
            "aws4_request",
        ):
            raise Refused(
                "SignatureDoesNotMatch",
                f"credential scope {'/'.join(parts[1:])} is not "
                f"{stamp[:8]}/{self.region}/{self.service}/aws4_request",
            )
        return "/".join(parts[1:])

    def _expect(self, signature: str, canonical: str, stamp: str, scope: str) -> None:
        to_sign = "\n".join(
            [ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = signing_key(self.secret_key, stamp[:8], self.region, self.service)
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise Refused(
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you "
                "provided. Check your key and signing method.",
            )

    @staticmethod
    def _canonical(
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        signed: str,
        payload: str,
    ) -> str:
        names = signed.split(";")
        if "host" not in names:
            raise Refused("AccessDenied", "the host header must be signed")
        lines = []
        for name in names:
            if name not in headers:
                raise Refused("AccessDenied", f"signed header {name!r} is missing")
            lines.append(f"{name}:{' '.join(headers[name].split())}")
        return "\n".join([method, path or "/", query, "\n".join(lines) + "\n", signed, payload])

    def _verify_header(
        self,
        environ: dict[str, Any],
        method: str,
        path: str,
        raw_query: str,
        headers: dict[str, str],
    ) -> None:
        match = _AUTH_HEADER.match(headers["authorization"].strip())
        if match is None:
            raise Refused("AccessDenied", "unsupported or malformed Authorization header")
        stamp = headers.get("x-amz-date", "")
        moment = _amz_time(stamp)
        if abs(self.now() - moment) > MAX_SKEW_S:
            raise Refused(
                "RequestTimeTooSkewed",
                "The difference between the request time and the current time is too large.",
            )
        scope = self._check_credential(match["credential"], stamp)
        payload = headers.get("x-amz-content-sha256")
        if payload is None:
            raise Refused("AccessDenied", "x-amz-content-sha256 is required", "400 Bad Request")
        if payload not in PAYLOAD_MARKERS:
            # A declared hash of the body: check it, then hand moto the body already read.
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), payload.lower()):
                raise Refused(
                    "XAmzContentSHA256Mismatch",
                    "The provided 'x-amz-content-sha256' header does not match what was computed.",
                    "400 Bad Request",
                )
        canonical = self._canonical(
            method,
            path,
            canonical_query(raw_query),
            headers,
            match["signed"],
            payload,
        )
        self._expect(match["signature"], canonical, stamp, scope)

    def _verify_query(
        self,
        method: str,
        path: str,
        raw_query: str,
        query: dict[str, str],
        headers: dict[str, str],
    ) -> None:
        required = (
            "X-Amz-Algorithm",
            "X-Amz-Credential",
            "X-Amz-Date",
            "X-Amz-Expires",
            "X-Amz-SignedHeaders",
            "X-Amz-Signature",
        )
        missing = [name for name in required if not query.get(name)]
        if missing:
            raise Refused("AccessDenied", f"presigned URL lacks {', '.join(missing)}")
        if query["X-Amz-Algorithm"] != ALGORITHM:
            raise Refused("AccessDenied", f"unsupported algorithm {query['X-Amz-Algorithm']!r}")
        stamp = query["X-Amz-Date"]
        moment = _amz_time(stamp)
        try:
            expires = int(query["X-Amz-Expires"])
        except ValueError:
            raise Refused("AccessDenied", "X-Amz-Expires is not a number") from None
        if not 1 <= expires <= MAX_EXPIRES_S:
            raise Refused("AccessDenied", f"X-Amz-Expires must be in [1, {MAX_EXPIRES_S}]")
        now = self.now()
        if now > moment + expires:
            raise Refused("AccessDenied", "Request has expired")
        if now < moment - MAX_SKEW_S:
            raise Refused("AccessDenied", "Request is not valid yet")
        scope = self._check_credential(query["X-Amz-Credential"], stamp)
        canonical = self._canonical(
            method,
            path,
            canonical_query(raw_query, drop="X-Amz-Signature"),
            headers,
            query["X-Amz-SignedHeaders"],
            query.get("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"),
        )
        self._expect(query["X-Amz-Signature"].lower(), canonical, stamp, scope)


class SigV4S3Server:
    """moto's S3 server on ``127.0.0.1:port`` (a thread), every request through a
    ``SigV4Verifier`` (``self.verifier``: its clock offset and refusals)."""

    def __init__(
        self, port: int, *, access_key: str, secret_key: str, region: str = "us-east-1"
    ) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )

        self.port = port
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self.verifier = SigV4Verifier(
            DomainDispatcherApplication(create_backend_app),
            access_key=access_key,
            secret_key=secret_key,
            region=region,
        )
        self._handler = MotoRequestHandler
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = make_server(
            "127.0.0.1", self.port, self.verifier, True, request_handler=self._handler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> SigV4S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
