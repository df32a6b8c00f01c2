"""The FastAPI application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute

from service import bootstrap, errors_http, logs
from service.access_schema import declare_access
from service.audit_trail.endpoints import router as audit_router
from service.auth.endpoints import router as auth_router
from service.budgets.endpoints import router as budgets_router
from service.config import Settings, get_settings
from service.console import endpoints as console
from service.datasets.endpoints import router as datasets_router
from service.db import transaction
from service.meta.endpoints import router as meta_router
from service.meta.metrics import RequestMetrics
from service.models import utcnow
from service.releases import repository as release_repository
from service.releases.endpoints import make_router as releases_router
from service.releases.endpoints import mechanisms_router
from service.releases.mechanisms import route
from service.releases.sweeper import Sweeper
from service.request_limits import RequestLimits
from service.runtime import InProcessDispatcher, Runtime
from service.upload_slots import UploadSlots

log = logging.getLogger(__name__)

DESCRIPTION = """\
Differentially private dataset release. Owners upload a dataset with public feature bounds
and a privacy budget (ε, δ); releases are synthetic datasets whose privacy cost is composed
in a per-dataset ledger that refuses anything that would pass the budget. Neighbouring
datasets differ in one replaced record; the number of rows is public.

Authenticate with `Authorization: Bearer <key>`. Every operation declares the roles it admits
(`x-access.roles`) and, where it takes ids, the object-level rule (`x-access.objects`); ids
of objects the key may not see answer 404 exactly like ids that do not exist.
"""


def _operation_id(route: APIRoute) -> str:
    # The endpoint's function name: stable, readable ids that tests and clients key on.
    return route.name


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    runtime_factory: Callable[[Settings], Runtime] | None = None,
) -> FastAPI:
    """The app. It serves with ``runtime`` when one is given (the caller owns it), else with
    one that ``runtime_factory`` builds at start-up, after migrations, and that it disposes of
    at shutdown (``service.run.app_factory`` passes the server's). With neither, the app can
    describe itself (``openapi()``) but not start."""
    if runtime is not None and runtime_factory is not None:
        raise TypeError("create_app() takes runtime= or runtime_factory=, not both")
    settings = settings or (runtime.settings if runtime else get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime
        if rt is None:
            if runtime_factory is None:
                raise RuntimeError(
                    "create_app() needs runtime= or runtime_factory= to start; "
                    "serve service.run:app_factory instead"
                )
            bootstrap.prepare(settings)
            rt = runtime_factory(settings)
        bootstrap.ensure_admin(rt)
        app.state.runtime = rt
        # uvicorn has configured its loggers by now: JSON lines, third-party chatter kept
        # out, research releases' traces dropped (``service.logs``).
        logs.configure(settings.log_level)
        if isinstance(rt.dispatcher, InProcessDispatcher):
            _resume_unfinished(rt)
        sweeping = None
        if rt.settings.sweep_interval_s > 0:
            sweeping = asyncio.create_task(
                _sweep_forever(Sweeper(rt), rt.settings.sweep_interval_s)
            )
        try:
            yield
        finally:
            if sweeping is not None:
                sweeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeping
            if runtime is None:
                rt.dispatcher.shutdown()
                rt.engine.dispose()

    app = FastAPI(
        title="dprelease",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        responses=errors_http.COMMON_RESPONSES,
        # /docs and /redoc are served by service.console from vendored assets (no CDN).
        docs_url=None,
        redoc_url=None,
    )
    errors_http.install(app)
    # Added first, so it runs inside RequestLimits: rate and size checks come before a slot.
    app.add_middleware(UploadSlots)
    app.add_middleware(RequestLimits)
    # Outermost: times every request, refusals by the limits included.
    app.add_middleware(RequestMetrics)
    for router in (
        auth_router,
        datasets_router,
        releases_router(),
        budgets_router,
        mechanisms_router,
        audit_router,
        meta_router,
    ):
        declare_access(router)
        app.include_router(router)

    declare_access(app.router)
    console.install(app)
    return app


def _resume_unfinished(runtime: Runtime) -> None:
    """In-process jobs die with the process: queue again what a previous run left."""
    with transaction(runtime.session_factory) as session:
        unfinished = release_repository.unfinished(session)
        for pending in unfinished:  # handed over now: not due for the sweeper yet
            release_repository.touch_queued(session, release_id=pending.id, at=utcnow())
    # Not logged: a research release's existence is its owner's alone (service.owner_only).
    for pending in unfinished:
        runtime.dispatcher.enqueue(
            pending.id, route(pending.mechanism, pending.work, runtime.settings)
        )


async def _sweep_forever(sweeper: Sweeper, interval_s: float) -> None:
    """The outbox sweeper (``service.releases.sweeper``): a pass now, then every
    ``interval_s``, each on a worker thread so that the event loop keeps serving."""
    while True:
        try:
            await asyncio.to_thread(sweeper.sweep)
        except Exception:  # the database may be down too: try again at the next pass
            log.exception("sweeper pass failed")
        await asyncio.sleep(interval_s)
