"""Request-scoped dependencies, as ``Annotated`` aliases.

The session commits when the endpoint returns (before the response is sent, so a failed
commit is a 500, never a success that did not persist), then runs the callbacks registered
with ``after_commit`` (e.g. enqueueing a job only once its row is durable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from service.auth.schemas import Role
from service.auth.service import authenticate
from service.errors import Forbidden
from service.models import Principal
from service.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    session.info.setdefault("after_commit", []).append(callback)


def on_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Undo a side effect outside the database (e.g. a stored object) if the unit fails."""
    session.info.setdefault("on_rollback", []).append(callback)


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    session = runtime.session_factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        for undo in session.info.pop("on_rollback", []):
            undo()
        raise
    finally:
        callbacks = session.info.pop("after_commit", [])
        session.close()
    for callback in callbacks:
        callback()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_principal(
    session: SessionDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    return authenticate(session, authorization=authorization)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_roles(*roles: Role) -> Callable[[Principal], Principal]:
    allowed = {r.value for r in roles}

    def check(principal: PrincipalDep) -> Principal:
        if principal.role not in allowed:
            raise Forbidden(
                f"this operation needs role {' or '.join(sorted(allowed))}; "
                f"your key has role {principal.role}"
            )
        return principal

    return check


OwnerDep = Annotated[Principal, Depends(require_roles(Role.owner))]
AdminDep = Annotated[Principal, Depends(require_roles(Role.admin))]


IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Repeat a POST safely: the same key and body give the first response "
        "again (one charge); the same key with another body is refused with 422",
    ),
]
