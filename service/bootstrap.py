"""Start-up steps shared by the API server and the worker: migrations and the admin key."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

import migrations
from service.auth.service import ensure_admin_key, generate_key
from service.config import Settings
from service.db import transaction
from service.runtime import Runtime

log = logging.getLogger(__name__)


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


@functools.cache
def _head() -> str | None:
    """The migrations' head revision, read once per process (alembic compiles every revision
    script to find it)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def at_head(database_url: str) -> bool:
    """Whether the database's recorded revision is the migrations' head (read-only)."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision() == _head()
    finally:
        engine.dispose()


def upgrade(database_url: str) -> None:
    """Migrate to head; a database already there is left untouched without running alembic's
    environment (each start of a worker or an embedded service would otherwise load every
    revision script again)."""
    if at_head(database_url):
        return
    command.upgrade(alembic_config(database_url), "head")


def prepare(settings: Settings) -> None:
    """Create the embedded data directory and apply migrations (unless turned off)."""
    if settings.embedded:
        settings.home.mkdir(parents=True, exist_ok=True)
    if settings.run_migrations:
        upgrade(settings.effective_database_url)


def admin_key_file(settings: Settings) -> Path:
    return settings.home / "admin.key"


def ensure_admin(runtime: Runtime) -> None:
    """Register the configured admin key; in embedded mode generate one on first start."""
    settings = runtime.settings
    if settings.admin_key is not None:
        key = settings.admin_key.get_secret_value()
    else:
        path = admin_key_file(settings)
        if path.exists():
            key = path.read_text().strip()
        else:
            key = generate_key()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(key + "\n")
            # Printed once, on the console of whoever started the service, never logged.
            print(
                f"dprelease: generated admin API key (also in {path}):\n  {key}",
                file=sys.stderr,
                flush=True,
            )
    with transaction(runtime.session_factory) as session:
        ensure_admin_key(session, key=key)
