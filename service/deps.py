"""Request-scoped dependencies, as ``Annotated`` aliases.

The session is the request's unit of work (``service.db.unit_of_work``): it commits when the
endpoint returns (before the response is sent, so a failed commit is a 500, never a success
that did not persist), then runs the callbacks registered with ``service.db.after_commit``. A
callback that raises is logged and does not change the answer: the unit it followed is
committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.responses import JSONResponse
from fastapi.security.base import SecurityBase
from pydantic import BaseModel
from sqlalchemy.orm import Session

from service.auth.schemas import Role
from service.auth.service import authenticate, check_role
from service.db import unit_of_work
from service.errors import InvalidInput
from service.models import Principal
from service.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    with unit_of_work(runtime.session_factory()) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def locked_response(body: BaseModel, *, status_code: int) -> JSONResponse:
    """The response of a sync endpoint that holds a row lock (the budget row, an
    Idempotency-Key row) until its session commits: serialised here, in the endpoint's thread.

    Returning the model instead makes FastAPI validate it in another pool thread *before* the
    session's exit commits. A burst of requests for one dataset (40 per process fill anyio's
    default pool) parks every thread on that lock, so the holder never got its thread and the
    process stalled until connection-pool timeouts turned the waiters into 500s (found by
    tests/integration/test_ledger_concurrency.py). The session's exit runs outside that limit.
    """
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code)


class BearerKey(SecurityBase):
    """Declares ``Authorization: Bearer <key>`` in the OpenAPI schema of every operation that
    depends on it, and hands the raw header to ``authenticate`` (which explains what is wrong
    with it; fastapi's HTTPBearer would answer a bare 403 for a malformed header)."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(description="An API key: `Authorization: Bearer <key>`")
        self.scheme_name = "ApiKey"

    async def __call__(self, request: Request) -> str | None:
        return request.headers.get("Authorization")


bearer_key = BearerKey()


def get_principal(
    runtime: RuntimeDep, authorization: Annotated[str | None, Depends(bearer_key)]
) -> Principal:
    # A short read of its own, over before the endpoint's thread starts: the request's session
    # then holds a connection (and, on SQLite, the write lock) only inside the endpoint and its
    # commit. Holding one from here on, across FastAPI's hops between pool threads, let a burst
    # of requests park every connection on requests waiting for a thread while every thread
    # waited for a connection (see locked_response). The principal comes back detached, with
    # its columns loaded.
    with runtime.session_factory() as session:
        return authenticate(session, authorization=authorization)


PrincipalDep = Annotated[Principal, Depends(get_principal)]

ALL_ROLES = tuple(Role)


class RoleCheck:
    """A dependency admitting ``roles``; ``service.app`` declares them in the schema
    (``x-access``) from this object, so the declaration is what is enforced."""

    def __init__(self, *roles: Role) -> None:
        self.roles = tuple(sorted(roles))

    def __call__(self, principal: PrincipalDep) -> Principal:
        check_role(principal, self.roles)
        return principal


def require_roles(*roles: Role) -> RoleCheck:
    return RoleCheck(*roles)


OwnerDep = Annotated[Principal, Depends(require_roles(Role.owner))]
AdminDep = Annotated[Principal, Depends(require_roles(Role.admin))]
OwnerOrAdminDep = Annotated[Principal, Depends(require_roles(Role.owner, Role.admin))]


IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Repeat a POST safely: the same key and body give the first response "
        "again (one charge); the same key with another body is refused with 422",
    ),
]


def single_valued_query(request: Request) -> None:
    """No query parameter of this API takes several values: a repeated one is refused rather
    than silently reduced to its last value (a filter must never widen)."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise InvalidInput(f"query parameter {name!r} is given more than once")
        seen.add(name)


SingleValuedQuery = Depends(single_valued_query)
