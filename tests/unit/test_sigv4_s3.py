"""The signature-checking S3 server of the real-mode tests (tests/sigv4_s3.py): what is signed
right passes, anything else is refused as S3 refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import free_port
from tests.sigv4_s3 import SigV4S3Server, canonical_query

ACCESS, SECRET, BUCKET = "AKTEST", "secret-of-the-tests", "sigv4-bucket"
BODY = b"0123456789" * 1000


@pytest.fixture(scope="module")
def server() -> Iterator[SigV4S3Server]:
    s3 = SigV4S3Server(free_port(), access_key=ACCESS, secret_key=SECRET)
    s3.start()
    good = _client(s3)
    good.create_bucket(Bucket=BUCKET)
    good.put_object(Bucket=BUCKET, Key="a/release.npz", Body=BODY, ChecksumAlgorithm="SHA256")
    good.put_object(Bucket=BUCKET, Key="b/release.npz", Body=b"other", ChecksumAlgorithm="SHA256")
    try:
        yield s3
    finally:
        s3.stop()


@pytest.fixture(autouse=True)
def _clock(server: SigV4S3Server) -> Iterator[None]:
    server.verifier.offset = 0.0
    yield
    server.verifier.offset = 0.0


def _client(
    s3: SigV4S3Server, *, access: str = ACCESS, secret: str = SECRET, region: str = "us-east-1"
) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name=region,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        config=Config(signature_version="s3v4", retries={"max_attempts": 1}),
    )


def _presign(s3: SigV4S3Server, key: str = "a/release.npz", expires: int = 60, **kw: Any) -> str:
    url: str = _client(s3, **kw).generate_presigned_url(
        "get_object",
        Params={
            "Bucket": BUCKET,
            "Key": key,
            "ResponseContentDisposition": 'attachment; filename="release.npz"',
        },
        ExpiresIn=expires,
    )
    return url


def _error(response: httpx.Response) -> str:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/xml"
    return response.text


def _with_query(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for name, value in changes.items():
        name = name.replace("_", "-")
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return urlunsplit(parts._replace(query=urlencode(query)))


def test_header_signed_requests_pass(server: SigV4S3Server, tmp_path: Any) -> None:
    client = _client(server)
    path = tmp_path / "file.bin"
    path.write_bytes(b"x" * 300_000)
    with path.open("rb") as handle:  # a file body, as put_file sends it
        client.put_object(
            Bucket=BUCKET, Key="c/file", Body=handle, IfNoneMatch="*", ChecksumAlgorithm="SHA256"
        )
    assert client.head_object(Bucket=BUCKET, Key="c/file")["ContentLength"] == 300_000
    got = client.get_object(Bucket=BUCKET, Key="a/release.npz", ChecksumMode="ENABLED")
    assert got["Body"].read() == BODY
    client.delete_object(Bucket=BUCKET, Key="c/file")
    assert [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]] == [
        "a/release.npz",
        "b/release.npz",
    ]


def test_presigned_url_passes_within_its_lifetime(server: SigV4S3Server) -> None:
    url = _presign(server, expires=60)
    server.verifier.offset = (
        50.0  # X-Amz-Date has whole seconds, and a loaded machine is slow: margin
    )
    response = httpx.get(url)
    assert response.status_code == 200, response.text
    assert response.content == BODY
    assert response.headers["content-disposition"] == 'attachment; filename="release.npz"'


def test_wrong_secret_is_refused(server: SigV4S3Server) -> None:
    with pytest.raises(ClientError) as caught:
        _client(server, secret="not-the-secret").get_object(Bucket=BUCKET, Key="a/release.npz")
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert "SignatureDoesNotMatch" in _error(httpx.get(_presign(server, secret="nope")))


def test_unknown_access_key_is_refused(server: SigV4S3Server) -> None:
    with pytest.raises(ClientError) as caught:
        _client(server, access="AKOTHER").head_bucket(Bucket=BUCKET)
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "InvalidAccessKeyId" in _error(httpx.get(_presign(server, access="AKOTHER")))


def test_tampered_presigned_urls_are_refused(server: SigV4S3Server) -> None:
    url = _presign(server)
    parts = urlsplit(url)
    other_key = urlunsplit(parts._replace(path=parts.path.replace("/a/", "/b/")))
    other_bucket = urlunsplit(parts._replace(path=parts.path.replace(BUCKET, "other-bucket")))
    disposition = _with_query(url, response_content_disposition='attachment; filename="evil.html"')
    added = _with_query(url, response_content_type="text/html")
    longer = _with_query(url, X_Amz_Expires="3600")
    for tampered in (other_key, other_bucket, disposition, added, longer):
        assert "SignatureDoesNotMatch" in _error(httpx.get(tampered)), tampered
    # Signed for GET: no other method.
    assert "SignatureDoesNotMatch" in _error(httpx.put(url, content=b"overwrite"))


def test_expired_presigned_url_is_refused(server: SigV4S3Server) -> None:
    url = _presign(server, expires=60)
    assert httpx.get(url).status_code == 200
    server.verifier.offset = 61.0
    assert "Request has expired" in _error(httpx.get(url))


def test_wrong_scope_is_refused(server: SigV4S3Server) -> None:
    # Another region: signed with the right secret, for a scope this server does not serve.
    assert "scope" in _error(httpx.get(_presign(server, region="eu-west-1")))
    with pytest.raises(ClientError) as caught:
        _client(server, region="eu-west-1").get_object(Bucket=BUCKET, Key="a/release.npz")
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    # Another service, or another day than X-Amz-Date's, in the credential.
    url = _presign(server)
    credential = dict(parse_qsl(urlsplit(url).query))["X-Amz-Credential"]
    for scope in (
        credential.replace("/s3/", "/sqs/"),
        credential.replace(credential.split("/")[1], "20000101"),
    ):
        assert "scope" in _error(httpx.get(_with_query(url, X_Amz_Credential=scope)))


def test_missing_signature_is_refused(server: SigV4S3Server) -> None:
    url = _presign(server)
    assert "X-Amz-Signature" in _error(httpx.get(_with_query(url, X_Amz_Signature=None)))
    assert "AccessDenied" in _error(httpx.get(_with_query(url, X_Amz_Expires=None)))
    bare = urlunsplit(urlsplit(url)._replace(query=""))
    assert "not signed" in _error(httpx.get(bare))
    assert "AccessDenied" in _error(httpx.get(bare, headers={"Authorization": "Bearer x"}))


def test_body_must_match_its_signed_hash(server: SigV4S3Server) -> None:
    url = f"{server.endpoint_url}/{BUCKET}/d/object"
    request = AWSRequest(method="PUT", url=url, data=b"signed body")
    S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1").add_auth(request)
    headers = dict(request.headers.items())
    swapped = httpx.put(url, content=b"another body", headers=headers)
    assert swapped.status_code == 400 and "XAmzContentSHA256Mismatch" in swapped.text
    assert httpx.put(url, content=b"signed body", headers=headers).status_code == 200


def test_canonical_query_encodes_once_and_sorts() -> None:
    assert canonical_query("b=2&a=x%20y&a=1&c") == "a=1&a=x%20y&b=2&c="
    assert canonical_query("X-Amz-Signature=f&k=%2F", drop="X-Amz-Signature") == "k=%2F"
