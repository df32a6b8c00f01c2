"""``dprelease-server``: apply migrations and serve the API (with in-process jobs when no
Celery broker is configured).

This is the API server's composition root, the one module of ``service`` that imports
``worker``: it chooses how jobs are dispatched (``worker.dispatch.default_dispatcher``) and
hands the app a way to build its runtime. ``uvicorn service.run:app_factory --factory``
serves the same app (several ``--workers`` included).
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from service import logs
from service.app import create_app
from service.config import Settings, get_settings
from service.runtime import Runtime, build_runtime
from worker.dispatch import default_dispatcher


def server_runtime(settings: Settings) -> Runtime:
    """The API server's runtime: in-process jobs without a broker, Celery with one."""
    return build_runtime(settings, default_dispatcher)


def app_factory(settings: Settings | None = None) -> FastAPI:
    """The app that builds its runtime at start-up (``uvicorn ... --factory``)."""
    return create_app(settings or get_settings(), runtime_factory=server_runtime)


def main() -> None:
    settings = get_settings()
    mode = "embedded" if settings.embedded else "real"
    print(
        f"dprelease: {mode} mode, http://{settings.host}:{settings.port}, "
        f"data under {settings.home.resolve()}",
        flush=True,
    )
    uvicorn.run(
        app_factory(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=logs.uvicorn_config(settings.log_level),
    )


if __name__ == "__main__":
    main()
