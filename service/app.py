"""The FastAPI application."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import bootstrap, errors_http
from service.auth.endpoints import router as auth_router
from service.budgets.endpoints import router as budgets_router
from service.config import Settings, get_settings
from service.datasets.endpoints import router as datasets_router
from service.db import transaction
from service.releases import repository as release_repository
from service.releases.endpoints import mechanisms_router
from service.releases.endpoints import router as releases_router
from service.runtime import InProcessDispatcher, Runtime, build_runtime

log = logging.getLogger(__name__)

DESCRIPTION = """\
Differentially private dataset release. Owners upload a dataset with public feature bounds
and a privacy budget (ε, δ); releases are synthetic datasets whose privacy cost is composed
in a per-dataset ledger that refuses anything that would pass the budget. Neighbouring
datasets differ in one replaced record; the number of rows is public.

Authenticate with `Authorization: Bearer <key>`.
"""


def create_app(settings: Settings | None = None, *, runtime: Runtime | None = None) -> FastAPI:
    settings = settings or (runtime.settings if runtime else get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime
        if rt is None:
            bootstrap.prepare(settings)
            rt = build_runtime(settings)
        bootstrap.ensure_admin(rt)
        app.state.runtime = rt
        if isinstance(rt.dispatcher, InProcessDispatcher):
            _resume_unfinished(rt)
        try:
            yield
        finally:
            if runtime is None:
                rt.dispatcher.shutdown()
                rt.engine.dispose()

    app = FastAPI(
        title="dprelease",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    errors_http.install(app)
    app.include_router(auth_router)
    app.include_router(datasets_router)
    app.include_router(releases_router)
    app.include_router(budgets_router)
    app.include_router(mechanisms_router)

    @app.get("/health", tags=["meta"], summary="Liveness")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _resume_unfinished(runtime: Runtime) -> None:
    """In-process jobs die with the process: queue again what a previous run left."""
    with transaction(runtime.session_factory) as session:
        ids = release_repository.unfinished_ids(session)
    for release_id in ids:
        log.info("resuming release %s", release_id)
        runtime.dispatcher.enqueue(release_id)
