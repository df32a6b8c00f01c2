from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.audit_trail import service
from service.audit_trail.schemas import AuditPage, AuditQuery
from service.deps import AdminDep, SessionDep, SingleValuedQuery
from service.errors_http import responses

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get(
    "",
    responses=responses(401, 403, 422),
    dependencies=[SingleValuedQuery],
    summary="The audit trail of state changes, oldest first (admin)",
)
def list_audit_events(
    session: SessionDep, _admin: AdminDep, query: Annotated[AuditQuery, Query()]
) -> AuditPage:
    return service.list_events(session, **query.model_dump())
