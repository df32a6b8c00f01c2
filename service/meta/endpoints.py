"""Liveness, readiness and metrics: what orchestrators and Prometheus ask.

``/health`` is async and touches nothing: it answers on the event loop even when every
worker thread is busy (a burst of requests, an upload being parsed), so a liveness probe never
kills a process that is merely loaded. ``/ready`` asks the dependencies (``readiness``).
``/metrics`` is for the operator (admin key): see ``metrics`` for why.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from service.deps import AdminDep, RuntimeDep
from service.errors_http import responses
from service.meta import metrics, readiness
from service.meta.schemas import Health, Readiness, ReadinessCheck

router = APIRouter(tags=["meta"])


@router.get("/health", summary="Liveness")
async def health() -> Health:
    return Health(status="ok")


@router.get(
    "/ready",
    summary="Readiness: database, broker and object store reachable",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A dependency did not answer"}},
)
async def ready(runtime: RuntimeDep) -> JSONResponse:
    results = await readiness.check_all(runtime)
    ok = all(r.ok for r in results)
    body = Readiness(
        status="ready" if ok else "unavailable",
        checks={
            r.name: ReadinessCheck(ok=r.ok, seconds=round(r.seconds, 4), error=r.error)
            for r in results
        },
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ok else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics (admin)",
    response_class=Response,
    responses={
        200: {"content": {metrics.CONTENT_TYPE: {}}, "description": "Text exposition"},
        **responses(401, 403),
    },
)
def prometheus_metrics(runtime: RuntimeDep, _admin: AdminDep) -> Response:
    return Response(metrics.exposition(runtime), media_type=metrics.CONTENT_TYPE)
