from __future__ import annotations

from fastapi import APIRouter, status

from service.auth import service
from service.auth.schemas import ApiKeyCreate, ApiKeyCreated, Me, Role
from service.deps import AdminDep, PrincipalDep, SessionDep
from service.errors_http import responses

router = APIRouter(tags=["auth"])


@router.post(
    "/api-keys",
    status_code=status.HTTP_201_CREATED,
    responses=responses(401, 403, 422),
    summary="Create a principal and its API key (admin)",
)
def create_api_key(body: ApiKeyCreate, session: SessionDep, admin: AdminDep) -> ApiKeyCreated:
    return service.create_key(session, name=body.name, role=body.role, actor=admin.id)


@router.get("/me", responses=responses(401), summary="Who this key belongs to")
def me(principal: PrincipalDep) -> Me:
    return Me(principal_id=principal.id, name=principal.name, role=Role(principal.role))
