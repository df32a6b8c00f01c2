"""``dprelease-server``: apply migrations and serve the API (with in-process jobs when no
Celery broker is configured)."""

from __future__ import annotations

import uvicorn

from service.app import create_app
from service.config import get_settings


def main() -> None:
    settings = get_settings()
    mode = "embedded" if settings.embedded else "real"
    print(
        f"dprelease: {mode} mode, http://{settings.host}:{settings.port}, "
        f"data under {settings.home.resolve()}",
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
    )


if __name__ == "__main__":
    main()
