from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, status
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

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
from service.releases import service
from service.releases.mechanisms import catalogue
from service.releases.schemas import (
    MechanismList,
    PreviewOut,
    ReleaseList,
    ReleaseOut,
    ReleaseQuery,
    ReleaseRequest,
)
from service.releases.service import report_key

router = APIRouter(prefix="/releases", tags=["releases"])

_MEDIA = {
    "npz": "application/octet-stream",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ReleaseOut,
    responses=responses(401, 403, 404, 409, 422),
    summary="Request a release: calibrate or cost the noise, reserve budget, queue the job",
)
def create_release(
    body: Annotated[ReleaseRequest, Body()],
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


@router.post(
    "/preview",
    responses=responses(401, 403, 404, 422),
    summary="What a release would cost and leave, without charging or storing anything",
)
def preview_release(
    body: Annotated[ReleaseRequest, Body()],
    session: SessionDep,
    owner: OwnerDep,
    runtime: RuntimeDep,
) -> PreviewOut:
    return service.preview(session, principal=owner, request=body, settings=runtime.settings)


@router.get(
    "",
    responses=responses(401, 404, 422),
    dependencies=[SingleValuedQuery],
    summary="Releases this key may see",
)
def list_releases(
    session: SessionDep, principal: PrincipalDep, query: Annotated[ReleaseQuery, Query()]
) -> ReleaseList:
    return service.list_visible(session, principal=principal, dataset_id=query.dataset_id)


_READERS = "the dataset's owner, analysts granted the dataset, admins"


@router.get(
    "/{release_id}",
    responses=responses(401, 404),
    summary="Status of a release",
    openapi_extra=objects(_READERS),
)
def get_release(release_id: str, session: SessionDep, principal: PrincipalDep) -> ReleaseOut:
    release = service.get(session, principal=principal, release_id=release_id)
    return service.to_out(release, viewer=principal)


@router.get(
    "/{release_id}/download",
    responses={
        **responses(401, 404, 409),
        200: {"description": "The release file (embedded mode)"},
        307: {"description": "Redirect to a presigned URL of the object store"},
    },
    response_class=Response,
    summary="Download a succeeded release",
    openapi_extra=objects(_READERS),
)
def download_release(
    release_id: str, session: SessionDep, principal: PrincipalDep, runtime: RuntimeDep
) -> Response:
    release = service.get(session, principal=principal, release_id=release_id)
    if release.status != "succeeded" or release.artifact_key is None:
        raise NotReady(
            f"release {release_id} has no artifact yet (status {release.status})",
            detail={"status": release.status, "progress": release.progress},
        )
    filename = f"release-{release.id}.{release.format}"
    url = runtime.store.presigned_url(release.artifact_key, filename=filename)
    if url is not None:
        return RedirectResponse(url, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    path = runtime.store.local_path(release.artifact_key)
    assert path is not None
    return FileResponse(path, media_type=_MEDIA[release.format], filename=filename)


@router.get(
    "/{release_id}/report",
    responses=responses(
        401, 404, 409, 410, e410="The held-out dataset was deleted, and the report with it"
    ),
    summary="The owner-only utility report (computed on the owner's held-out raw data)",
    openapi_extra=objects("the owner who requested the release; nobody else, admins included"),
)
def get_report(
    release_id: str, session: SessionDep, principal: PrincipalDep, runtime: RuntimeDep
) -> dict[str, Any]:
    release = service.get(session, principal=principal, release_id=release_id)
    # Raw-data results: the requesting owner only; everyone else sees nothing at all.
    if release.report_dataset_id is None or principal.id != release.requested_by:
        raise NotFound(f"release {release_id} has no report for you")
    if service.report_erased(session, release):
        raise Gone(
            f"the report of release {release_id} was erased with its held-out dataset "
            f"{release.report_dataset_id}"
        )
    key = report_key(release.id)
    if not runtime.store.exists(key):
        raise NotReady(
            f"the report of release {release_id} is not ready (status {release.status})",
            detail={"status": release.status},
        )
    report: dict[str, Any] = json.loads(runtime.store.get(key))
    return report


mechanisms_router = APIRouter(tags=["releases"])


@mechanisms_router.get(
    "/mechanisms",
    responses=responses(401),
    summary="The mechanisms, their parameter schemas and accountants",
)
def list_mechanisms(_principal: PrincipalDep) -> MechanismList:
    return catalogue()
