from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile, status
from fastapi.responses import JSONResponse, Response

from service import idempotency, strict_json
from service.access_schema import objects
from service.datasets import service
from service.datasets.schemas import DatasetList, DatasetOut, GrantIn, GrantList, GrantOut
from service.deps import (
    IdempotencyKeyHeader,
    OwnerDep,
    OwnerOrAdminDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
    locked_response,
)
from service.errors import InvalidInput, PayloadTooLarge
from service.errors_http import responses

router = APIRouter(prefix="/datasets", tags=["datasets"])

_READ_CHUNK = 1 << 20


def _read_limited(upload: UploadFile, limit: int) -> bytes:
    # Read at most limit + 1 bytes: enough to know the file is too large without holding it.
    # Starlette has spooled the part to a temporary file (removed when the request ends);
    # this runs in a worker thread, so the blocking reads never stall the event loop.
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = upload.file.read(_READ_CHUNK)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    if size > limit:
        raise PayloadTooLarge(
            f"file is larger than the limit of {limit} bytes", detail={"limit_bytes": limit}
        )
    return b"".join(parts)


async def _one_of_each_part(request: Request) -> None:
    """A multipart upload names ``file`` and ``metadata`` once each: with two of either,
    which one was meant is a guess (the parsed form is cached: this reads nothing again)."""
    form = await request.form()
    repeated = [name for name in ("file", "metadata") if len(form.getlist(name)) > 1]
    if repeated:
        raise InvalidInput(
            f"the upload gives the part(s) {repeated} more than once: send one 'file' and one "
            "'metadata'",
            detail={"repeated": repeated},
        )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetOut,
    responses=responses(
        401,
        403,
        408,
        409,
        413,
        422,
        503,
        e413="Upload larger than DPRELEASE_MAX_UPLOAD_BYTES (code payload_too_large or "
        "dataset_too_large), or whose metadata (Parquet footer, .npy headers, CSV rows read "
        "so far) declares more values than DPRELEASE_MAX_UPLOAD_CELLS or more decoded bytes "
        "than DPRELEASE_MAX_UPLOAD_DECODED_BYTES (code dataset_too_large; refused before "
        "decoding)",
    ),
    summary="Upload a dataset (CSV, Parquet or NPZ) with its public bounds and budget",
)
def create_dataset(
    file: Annotated[UploadFile, File(description="CSV, Parquet or NPZ (arrays X and y)")],
    metadata: Annotated[str, Form(description="JSON: name, label_column, feature_range, …")],
    _single: Annotated[None, Depends(_one_of_each_part)],
    session: SessionDep,
    owner: OwnerDep,
    runtime: RuntimeDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Any:
    # A sync endpoint: FastAPI runs it in a worker thread, so reading, parsing and storing
    # never block the event loop (/health and every other tenant keep being answered). At
    # most DPRELEASE_MAX_CONCURRENT_UPLOADS of these run at once, and as many per principal
    # as DPRELEASE_MAX_CONCURRENT_UPLOADS_PER_PRINCIPAL; a body that arrives too slowly is cut
    # off before this runs (service/upload_slots.py).
    content = _read_limited(file, runtime.settings.max_upload_bytes)
    filename = file.filename or ""
    if "\x00" in filename:
        raise InvalidInput(str(strict_json.NulCharacter("the file's name")))
    # Parsed before the session is used: no connection, no SQLite write lock and no
    # Idempotency-Key row lock is held while a large file is decoded.
    upload = service.check(
        content=content, filename=filename, metadata_json=metadata, settings=runtime.settings
    )
    record = None
    if idempotency_key is not None:
        outcome = idempotency.begin(
            session,
            principal_id=owner.id,
            key=idempotency_key,
            scope=service.UPLOAD_SCOPE,
            digest=idempotency.request_hash(filename, metadata, content),
        )
        if isinstance(outcome, idempotency.Replay):
            return JSONResponse(outcome.body, status_code=outcome.status_code)
        record = outcome
    dataset = service.create(session, principal=owner, upload=upload, store=runtime.store)
    out = service.to_out(session, dataset, viewer=owner)
    if record is not None:
        idempotency.finish(session, record, status_code=status.HTTP_201_CREATED, body=out)
    return locked_response(out, status_code=status.HTTP_201_CREATED)


@router.get("", responses=responses(401), summary="Datasets this key may see")
def list_datasets(session: SessionDep, principal: PrincipalDep) -> DatasetList:
    datasets = service.list_visible(session, principal=principal)
    return DatasetList(items=[service.to_out(session, d, viewer=principal) for d in datasets])


@router.get(
    "/{dataset_id}",
    responses=responses(401, 404),
    summary="One dataset",
    openapi_extra=objects("the dataset's owner, analysts granted it, admins"),
)
def get_dataset(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> DatasetOut:
    dataset = service.get(session, principal=principal, dataset_id=dataset_id)
    return service.to_out(session, dataset, viewer=principal)


@router.delete(
    "/{dataset_id}",
    responses=responses(
        401,
        403,
        404,
        409,
        e409="A queued or running release still reads the raw data (code releases_pending)",
    ),
    summary="Delete a dataset: erase its raw data; its ledger and releases stay (owner)",
    description="Erases the uploaded file from the object store, and the owner reports "
    "computed on it as a held-out set, then marks the dataset `deleted`: it takes no new "
    "release (409 `dataset_deleted`) while its ledger entries, grants and existing releases "
    "stay readable and downloadable. Refused with 409 `releases_pending` while a release "
    "that reads the raw data is queued or running. Repeating it is harmless. Owner only: "
    "admins audit, they do not act on tenants' data.",
    openapi_extra=objects("the dataset's owner"),
)
def delete_dataset(
    dataset_id: str, session: SessionDep, owner: OwnerDep, runtime: RuntimeDep
) -> DatasetOut:
    dataset = service.delete(session, principal=owner, dataset_id=dataset_id, store=runtime.store)
    return service.to_out(session, dataset, viewer=owner)


@router.post(
    "/{dataset_id}/grants",
    status_code=status.HTTP_201_CREATED,
    responses=responses(401, 403, 404, 422),
    summary="Let an analyst list and download this dataset's releases (owner)",
    openapi_extra=objects("the dataset's owner"),
)
def create_grant(dataset_id: str, body: GrantIn, session: SessionDep, owner: OwnerDep) -> GrantOut:
    return service.grant(
        session, principal=owner, dataset_id=dataset_id, analyst_id=body.principal_id
    )


@router.get(
    "/{dataset_id}/grants",
    responses=responses(401, 403, 404),
    summary="The analysts granted this dataset (owner, admin)",
    openapi_extra=objects("the dataset's owner, admins"),
)
def list_grants(dataset_id: str, session: SessionDep, principal: OwnerOrAdminDep) -> GrantList:
    return GrantList(items=service.list_grants(session, principal=principal, dataset_id=dataset_id))


@router.delete(
    "/{dataset_id}/grants/{grant_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=responses(401, 403, 404),
    summary="Revoke a grant: the analyst no longer sees this dataset's releases (owner)",
    openapi_extra=objects("the dataset's owner; the grant must be one of this dataset's"),
)
def revoke_grant(dataset_id: str, grant_id: str, session: SessionDep, owner: OwnerDep) -> Response:
    service.revoke_grant(session, principal=owner, dataset_id=dataset_id, grant_id=grant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
