from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Response, status

from service.access_schema import objects
from service.auth import service
from service.auth.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyList, Me, PrincipalKey, Role
from service.deps import AdminDep, PrincipalDep, SessionDep
from service.errors_http import responses
from service.models import utcnow

router = APIRouter(tags=["auth"])


@router.post(
    "/api-keys",
    status_code=status.HTTP_201_CREATED,
    responses=responses(
        401, 403, 404, 422, e404="principal_id names no principal (another key for a principal)"
    ),
    summary="Create a principal and its API key, or another key for a principal (admin)",
)
def create_api_key(body: ApiKeyCreate, session: SessionDep, admin: AdminDep) -> ApiKeyCreated:
    expires_at = None
    if body.expires_in is not None:
        expires_at = utcnow() + timedelta(seconds=body.expires_in)
    if isinstance(body, PrincipalKey):
        return service.create_key(
            session, principal_id=body.principal_id, expires_at=expires_at, actor=admin.id
        )
    return service.create_key(
        session, name=body.name, role=body.role, expires_at=expires_at, actor=admin.id
    )


@router.get(
    "/api-keys",
    responses=responses(401),
    summary="API keys, never their secrets (admin: every key; owner, analyst: their own)",
)
def list_api_keys(session: SessionDep, principal: PrincipalDep) -> ApiKeyList:
    return ApiKeyList(items=service.list_keys(session, principal=principal))


@router.delete(
    "/api-keys/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=responses(
        401,
        404,
        409,
        e409="the key is the last active (unrevoked, unexpired) admin key: create another "
        "admin key first (code last_admin_key)",
    ),
    summary="Revoke an API key: its next request is refused with 401 (admin: any key; owner, "
    "analyst: their own)",
    openapi_extra=objects("admins: any key; owners and analysts: their own keys"),
)
def revoke_api_key(key_id: str, session: SessionDep, principal: PrincipalDep) -> Response:
    service.revoke_key(session, principal=principal, key_id=key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/me", responses=responses(401), summary="Who this key belongs to")
def me(principal: PrincipalDep) -> Me:
    return Me(principal_id=principal.id, name=principal.name, role=Role(principal.role))
