"""Release endpoints. The request body of create and preview is the union of the served
mechanisms' requests, so the router is built from the registry (``make_router``)."""

import functools
import inspect
import json
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, status
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from dpcore.mechanisms import registry
from service import idempotency
from service.access_schema import objects
from service.deps import (
    IdempotencyKeyHeader,
    OwnerDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
    SingleValuedQuery,
    locked_response,
)
from service.errors import Gone, NotFound, NotReady
from service.errors_http import responses
from service.models import Principal, Release
from service.releases import conversions, keys, service, summaries
from service.releases.mechanisms import catalogue, request_union
from service.releases.schemas import (
    MechanismList,
    PreviewOut,
    ReleaseFormat,
    ReleaseList,
    ReleaseOut,
    ReleaseQuery,
    ReleaseRequestBase,
    ReleaseSummary,
)
from service.releases.status import ReleaseStatus
from service.releases.summary import METADATA_ARTIFACT
from service.runtime import Runtime
from service.storage import ObjectStream

_MEDIA = {
    "npz": "application/octet-stream",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}


def create_release(
    body: ReleaseRequestBase,
    session: SessionDep,
    owner: OwnerDep,
    runtime: RuntimeDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Any:
    record = None
    if idempotency_key is not None:
        outcome = idempotency.begin(
            session,
            principal_id=owner.id,
            key=idempotency_key,
            scope="POST /releases",
            digest=idempotency.request_hash(idempotency.canonical_json(body)),
        )
        if isinstance(outcome, idempotency.Replay):
            return JSONResponse(outcome.body, status_code=outcome.status_code)
        record = outcome
    release = service.create(
        session,
        principal=owner,
        request=body,
        settings=runtime.settings,
        dispatcher=runtime.dispatcher,
    )
    out = service.to_out(release, viewer=owner)
    if record is not None:
        idempotency.finish(session, record, status_code=status.HTTP_202_ACCEPTED, body=out)
    return locked_response(out, status_code=status.HTTP_202_ACCEPTED)


def preview_release(
    body: ReleaseRequestBase,
    session: SessionDep,
    owner: OwnerDep,
    runtime: RuntimeDep,
) -> PreviewOut:
    return service.preview(session, principal=owner, request=body, settings=runtime.settings)


def list_releases(
    session: SessionDep, principal: PrincipalDep, query: Annotated[ReleaseQuery, Query()]
) -> ReleaseList:
    return service.list_visible(session, principal=principal, dataset_id=query.dataset_id)


_READERS = "the dataset's owner, analysts granted the dataset, admins"
_MANAGERS = "the owner of the release's dataset"


def get_release(release_id: str, session: SessionDep, principal: PrincipalDep) -> ReleaseOut:
    release = service.get(session, principal=principal, release_id=release_id)
    return service.to_out(release, viewer=principal)


def cancel_release(release_id: str, session: SessionDep, owner: OwnerDep) -> JSONResponse:
    release = service.cancel(session, principal=owner, release_id=release_id)
    # Serialised here: the session holds the release row lock until it commits.
    return locked_response(service.to_out(release, viewer=owner), status_code=status.HTTP_200_OK)


def _require_succeeded(release: Release) -> None:
    """Only a succeeded release serves files. A cancelled one never does, even when a job
    that had claimed its upload stored output before the cancel (it stays charged)."""
    if release.status == ReleaseStatus.cancelled:
        raise NotReady(
            f"release {release.id} was cancelled: it has no artifact",
            detail={"status": str(release.status)},
        )
    if release.status != ReleaseStatus.succeeded or release.artifact_key is None:
        raise NotReady(
            f"release {release.id} has no artifact yet (status {release.status})",
            detail={"status": str(release.status), "progress": release.progress},
        )


def _succeeded_release(runtime: Runtime, principal: Principal, release_id: str) -> Release:
    """The succeeded release the caller may read, from a short session of its own: it comes
    back detached, its columns loaded, before the endpoint's long work on its file (a summary,
    a format conversion, metadata read from the file). On SQLite every transaction holds the
    write lock from its start (``service.db``), so a request session held across that work
    kept every other tenant's request waiting, and answered them 500 past the busy timeout
    (issue 35; tests/integration/test_tenant_isolation.py)."""
    with runtime.session_factory() as session:
        release = service.get(session, principal=principal, release_id=release_id)
        _require_succeeded(release)
        return release


def download_release(
    release_id: str,
    principal: PrincipalDep,
    runtime: RuntimeDep,
    format: Annotated[
        ReleaseFormat | None,
        Query(
            description="The file format to download (default: the release's own). Another "
            "format is converted from the stored file on its first download and kept: the "
            "same rows, columns and metadata, no charge (post-processing)"
        ),
    ] = None,
) -> Response:
    release = _succeeded_release(runtime, principal, release_id)
    assert release.artifact_key is not None
    fmt = format or release.format
    filename = f"release-{release.id}.{fmt}"
    if fmt == release.format:
        return _serve(runtime, release.artifact_key, filename, _MEDIA[fmt])
    key = conversions.converted_key(release, fmt, runtime.store, runtime.settings)
    return _serve(runtime, key, filename, _MEDIA[fmt])


def summarise_release(
    release_id: str, principal: PrincipalDep, runtime: RuntimeDep
) -> ReleaseSummary:
    # Exactly what the download serves, to exactly its readers: post-processing of the
    # release, so it costs no privacy.
    release = _succeeded_release(runtime, principal, release_id)
    return summaries.summary_of(release, principal.id, runtime.store, runtime.settings)


def download_release_artifact(
    release_id: str, name: str, principal: PrincipalDep, runtime: RuntimeDep
) -> Response:
    release = _succeeded_release(runtime, principal, release_id)
    record = next((a for a in release.artifacts or () if a["name"] == name), None)
    if record is None and name == METADATA_ARTIFACT:
        # Every release's metadata, whatever its format (NPZ and Parquet carry theirs).
        stored = conversions.metadata_key(release, runtime.store, runtime.settings)
        if stored is not None:
            filename = f"release-{release.id}-{name}"
            return _serve(runtime, stored, filename, "application/json")
    if record is None:
        raise NotFound(f"release {release_id} has no artifact named {name!r}")
    key = keys.extra_artifact(release.id, name)
    return _serve(runtime, key, f"release-{release.id}-{name}", record["media_type"])


def download_raw_release(
    release_id: str, session: SessionDep, principal: OwnerDep, runtime: RuntimeDep
) -> Response:
    release = service.get(session, principal=principal, release_id=release_id)
    # As DP as the release itself, but not what analysts were meant to get: the owner only.
    if not service.is_owner(release, principal):
        raise NotFound(f"release {release_id} has no raw rows for you")
    _require_succeeded(release)
    key = keys.raw(release.id, release.format)
    if not runtime.store.exists(key):
        raise NotFound(
            f"release {release_id} has no separate raw copy: its download is the rows as drawn "
            "(no post-processing or mapping into the declared domain changed them)"
        )
    filename = f"release-{release.id}-raw.{release.format}"
    return _serve(runtime, key, filename, _MEDIA[release.format])


def _serve(runtime: Runtime, key: str, filename: str, media_type: str) -> Response:
    """A stored object: the local file (embedded mode's store), a redirect to a short-lived
    presigned URL (S3, ``download_mode`` ``presigned``), or the object streamed from S3
    (``stream``). Access was checked by the caller, now: a streamed download never outlives
    a revoked grant, a presigned URL by at most ``s3_presign_seconds``."""
    settings = runtime.settings
    if settings.download_mode == "presigned":
        url = runtime.store.presigned_url(key, filename=filename)
        if url is not None:
            return RedirectResponse(url, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    path = runtime.store.local_path(key)
    if path is not None:
        return FileResponse(path, media_type=media_type, filename=filename)
    # Opened before answering, so a missing object fails the request instead of a 200 that
    # stops short.
    stream = runtime.store.open_stream(key, chunk_bytes=settings.download_chunk_bytes)
    headers = {
        "Content-Length": str(stream.size),
        # As the presigned URL's response-content-disposition and the local FileResponse.
        "Content-Disposition": f'attachment; filename="{filename}"',
    }
    if stream.etag:
        headers["ETag"] = stream.etag
    if stream.checksum_sha256:
        headers["x-amz-checksum-sha256"] = stream.checksum_sha256
    return StreamingResponse(_chunks(stream), media_type=media_type, headers=headers)


def _chunks(stream: ObjectStream) -> Iterator[bytes]:
    try:
        yield from stream.chunks
    finally:
        stream.close()


def get_report(
    release_id: str, session: SessionDep, principal: OwnerDep, runtime: RuntimeDep
) -> dict[str, Any]:
    release = service.get(session, principal=principal, release_id=release_id)
    # Raw-data results: the requesting owner only; everyone else sees nothing at all.
    if release.report_dataset_id is None or not service.is_owner(release, principal):
        raise NotFound(f"release {release_id} has no report for you")
    if release.status == ReleaseStatus.cancelled:
        raise NotReady(
            f"release {release_id} was cancelled: it has no report",
            detail={"status": str(release.status)},
        )
    if service.report_erased(session, release):
        raise Gone(
            f"the report of release {release_id} was erased with its held-out dataset "
            f"{release.report_dataset_id}"
        )
    key = keys.report(release.id)
    if not runtime.store.exists(key):
        raise NotReady(
            f"the report of release {release_id} is not ready (status {release.status})",
            detail={"status": release.status},
        )
    report: dict[str, Any] = json.loads(runtime.store.get(key))
    return report


mechanisms_router = APIRouter(tags=["releases"])

# How the download endpoints answer (DPRELEASE_DOWNLOAD_MODE; docs: docs/api.md, "Downloads").
_BODY_WHEN = (
    "(the local object store of embedded mode, or S3 with DPRELEASE_DOWNLOAD_MODE=stream: "
    "streamed by the API, with Content-Length, Content-Disposition, ETag and, when stored, "
    "x-amz-checksum-sha256)"
)
_REDIRECT = (
    "Redirect to a presigned URL of the object store (S3 with DPRELEASE_DOWNLOAD_MODE="
    "presigned, the default), valid DPRELEASE_S3_PRESIGN_SECONDS (60 by default, at most "
    "3600): for at most that long it outlives a revocation of the caller's grant or key"
)


@mechanisms_router.get(
    "/mechanisms",
    responses=responses(401),
    summary="The mechanisms, their parameter schemas and accountants",
)
def list_mechanisms(_principal: PrincipalDep) -> MechanismList:
    return catalogue()


def make_router() -> APIRouter:
    """The ``/releases`` routes, with the request body of the mechanisms served now."""
    request: Any = request_union(registry.served())
    router = APIRouter(prefix="/releases", tags=["releases"])

    def body_of(endpoint: Any) -> Any:
        # The same endpoint, whose body parameter takes the served mechanisms' requests.
        signature = inspect.signature(endpoint)
        parameters = [
            p.replace(annotation=Annotated[request, Body()]) if p.name == "body" else p
            for p in signature.parameters.values()
        ]

        @functools.wraps(endpoint)
        def route(*args: Any, **kwargs: Any) -> Any:
            return endpoint(*args, **kwargs)

        route.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return route

    router.add_api_route(
        "",
        body_of(create_release),
        methods=["POST"],
        status_code=status.HTTP_202_ACCEPTED,
        response_model=ReleaseOut,
        responses=responses(
            401,
            403,
            404,
            409,
            422,
            e409="The budget would be exceeded (budget_exceeded), the dataset was deleted "
            "(dataset_deleted) or declared no classes (classes_undeclared)",
        ),
        summary="Request a release: calibrate or cost the noise, reserve budget, queue the job",
    )
    router.add_api_route(
        "/preview",
        body_of(preview_release),
        methods=["POST"],
        responses=responses(
            401,
            403,
            404,
            409,
            422,
            e409="The dataset was deleted (dataset_deleted) or declared no classes "
            "(classes_undeclared)",
        ),
        summary="What a release would cost and leave, without charging or storing anything",
    )
    router.add_api_route(
        "",
        list_releases,
        methods=["GET"],
        responses=responses(401, 404, 422),
        dependencies=[SingleValuedQuery],
        summary="Releases this key may see",
    )
    router.add_api_route(
        "/{release_id}",
        get_release,
        methods=["GET"],
        responses=responses(401, 404),
        summary="Status of a release",
        openapi_extra=objects(_READERS),
    )
    router.add_api_route(
        "/{release_id}/cancel",
        cancel_release,
        methods=["POST"],
        response_model=ReleaseOut,
        responses=responses(
            401,
            403,
            404,
            409,
            e409="The release already succeeded or failed (code release_finished)",
        ),
        summary="Cancel a queued or running release (refunded unless its job read the data)",
        description="Under the release's row lock: a queued or running release whose job has "
        "not begun reading the dataset's content is cancelled and its charge refunded; once it "
        "has (when the cancel lands may then depend on the data), or once the upload of its "
        "output is claimed (output may exist), it is cancelled with the charge committed "
        "(`settlement` says which: docs/privacy.md, 'Failures and cancellations'), and it is "
        "never served. The committed charge is the release's whole ε, whatever its progress "
        "(a sharded release's too, however few of its shards were drawn). Before cancelling, "
        "`GET /releases/{id}` tells the owner which applies now (`if_cancelled`). "
        "Cancelling a cancelled release returns it unchanged; a succeeded "
        "or failed one answers 409. A running job notices at its next progress write and "
        "stops.",
        openapi_extra=objects(_MANAGERS),
    )
    router.add_api_route(
        "/{release_id}/download",
        download_release,
        methods=["GET"],
        responses={
            **responses(
                401,
                404,
                409,
                503,
                e409="The release is not ready or was cancelled (not_ready); or, for another "
                "format than its own, its file is larger than DPRELEASE_CONVERSION_MAX_BYTES "
                "(conversion_too_large) or was made before release layouts (not_convertible)",
                e503="This API process already converts DPRELEASE_MAX_CONCURRENT_CONVERSIONS "
                "release files (conversions_busy), or the object store did not answer "
                "(store_unavailable): retry after Retry-After",
            ),
            200: {"description": f"The release file {_BODY_WHEN}"},
            307: {"description": _REDIRECT},
        },
        response_class=Response,
        summary="Download a succeeded release, in its own format or any other",
        openapi_extra=objects(_READERS),
    )
    router.add_api_route(
        "/{release_id}/summary",
        summarise_release,
        methods=["GET"],
        responses=responses(
            401,
            404,
            409,
            503,
            e409="The release is not ready or was cancelled (not_ready), or its file is larger "
            "than DPRELEASE_SUMMARY_MAX_BYTES (summary_too_large)",
            e503="Its summary is not stored yet and this API process already computes "
            "DPRELEASE_MAX_CONCURRENT_SUMMARIES summaries, or this key "
            "DPRELEASE_MAX_CONCURRENT_SUMMARIES_PER_KEY (summaries_busy); or the object store "
            "did not answer (store_unavailable): retry after Retry-After",
        ),
        summary="A succeeded release's file summarised: shape, sample rows, histograms",
        description="Post-processing of the file GET /releases/{id}/download serves (never "
        "the owner's raw rows), so it costs no privacy: the row count, columns, the declared "
        "value range, 64 rows spread evenly over the file (row ⌊i·n/64⌋, each with its index; "
        "features and label as released) and, per "
        "column, a histogram of 20 bins over the declared range (or the column's min–max); "
        "for image-shaped rows (a 2-D feature_shape) the label histograms only. Computed "
        "once, reading the file chunk by chunk, and kept beside the release: later requests, "
        "by any of its readers, get the stored summary.",
        openapi_extra=objects(_READERS),
    )
    router.add_api_route(
        "/{release_id}/artifacts/{name}",
        download_release_artifact,
        methods=["GET"],
        responses={
            **responses(
                401,
                404,
                409,
                e404="Not found (or not visible to this key), or the release has no artifact "
                "of that name",
            ),
            200: {"description": f"The file {_BODY_WHEN}"},
            307: {"description": _REDIRECT},
        },
        response_class=Response,
        summary="Download a further file of a succeeded release (listed in its `artifacts`; "
        "`metadata.json`, the release file's metadata, for every release)",
        openapi_extra=objects(_READERS),
    )
    router.add_api_route(
        "/{release_id}/raw",
        download_raw_release,
        methods=["GET"],
        responses={
            **responses(
                401,
                403,
                404,
                409,
                e404="Not found (or not yours), or the release was not post-processed",
            ),
            200: {"description": f"The rows as drawn, before post-processing {_BODY_WHEN}"},
            307: {"description": _REDIRECT},
        },
        response_class=Response,
        summary="Download the raw noisy rows of a post-processed release (owner only)",
        openapi_extra=objects(_MANAGERS),
    )
    router.add_api_route(
        "/{release_id}/report",
        get_report,
        methods=["GET"],
        responses=responses(
            401,
            403,
            404,
            409,
            410,
            e410="The held-out dataset was deleted, and the report with it",
        ),
        summary="The owner-only utility report (computed on the owner's held-out raw data)",
        openapi_extra=objects("the owner who requested the release; nobody else, admins included"),
    )
    return router
