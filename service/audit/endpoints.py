from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from service.audit import service
from service.audit.schemas import AuditPage, ObjectType
from service.deps import AdminDep, SessionDep
from service.errors_http import responses

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get(
    "",
    responses=responses(401, 403, 422),
    summary="The audit trail of state changes, oldest first (admin)",
)
def list_audit_events(
    session: SessionDep,
    _admin: AdminDep,
    object_type: Annotated[ObjectType | None, Query()] = None,
    object_id: Annotated[str | None, Query(max_length=64)] = None,
    actor: Annotated[
        str | None, Query(max_length=64, description="Principal id, 'worker' or 'system'")
    ] = None,
    since: Annotated[
        datetime | None, Query(description="Events at or after this time (UTC if no offset)")
    ] = None,
    cursor: Annotated[
        str | None,
        Query(pattern=r"^[0-9]{1,18}$", description="next_cursor of the previous page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    return service.list_events(
        session,
        object_type=object_type,
        object_id=object_id,
        actor=actor,
        since=since,
        cursor=cursor,
        limit=limit,
    )
