"""Who may call each operation, declared in the OpenAPI schema as ``x-access``.

``roles`` is read from the operation's dependencies (the ``RoleCheck`` or plain authentication
it actually runs), so the declaration cannot drift from what is enforced; ``objects`` is the
object-level rule of operations that take ids, written beside the route with ``objects()``.
tests/integration/test_access_matrix.py checks both against every caller.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.deps import ALL_ROLES, RoleCheck, get_principal


def objects(rule: str) -> dict[str, Any]:
    """``openapi_extra`` of a route: who may act on the objects its ids name."""
    return {"x-access": {"objects": rule}}


def _roles(dependant: Dependant) -> set[str] | None:
    """The roles admitted, or None when nothing authenticates the caller."""
    admitted: set[str] | None = None
    for dep in dependant.dependencies:
        if isinstance(dep.call, RoleCheck):
            found: set[str] | None = set(dep.call.roles)
        elif dep.call is get_principal:
            found = {r.value for r in ALL_ROLES}
        else:
            found = _roles(dep)
        if found is not None:
            admitted = found if admitted is None else admitted & found
    return admitted


def declare_access(router: APIRouter) -> None:
    """Write ``x-access`` into the routes of ``router``; call it before including the router
    (fastapi composes included routes from the router's own)."""
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        roles = _roles(route.dependant)
        extra = dict(route.openapi_extra or {})
        access = dict(extra.get("x-access", {}))
        access["authenticated"] = roles is not None
        access["roles"] = sorted(roles or ())
        route.openapi_extra = {**extra, "x-access": access}
