"""What every ``dprelease`` command shares: the global state (the lazily created API client),
the error shown with exit status 1, and the JSON/stderr output helpers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click
import httpx

from dprelease_cli.client import Client

DEFAULT_URL = "http://127.0.0.1:8000"
NO_KEY_MESSAGE = "no API key: pass --key or set DPRELEASE_KEY"
ROLES = ("owner", "analyst", "admin")
FORMATS = ("npz", "csv", "parquet")
# The mechanism the records study measures best on every table and on MNIST, at ε = 1 and 10
# (docs/results/records_study.md; a test keeps it the best of recommendations.json's MNIST
# entries): named here so that `dprelease --help` does not import dpcore.
DEFAULT_MECHANISM = "clustmix"


class CliError(click.ClickException):
    """A failure shown as ``error: <message>`` (+ detail JSON) with exit status 1."""

    exit_code = 1

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail = detail or {}

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.message}", file=file, err=True)
        if self.detail:
            click.echo(json.dumps(self.detail, indent=2), file=file, err=True)


@dataclass
class CliState:
    """What the global options resolve to; passed to subcommands as the click ``obj``."""

    url: str = DEFAULT_URL
    key: str | None = None
    http: httpx.Client | None = None
    _api: Client | None = None

    def api(self) -> Client:
        """The API client; resolving the key only here keeps offline subcommands key-free."""
        if self._api is None:
            key = self.key or _key_from_home()
            if not key:
                raise CliError(NO_KEY_MESSAGE)
            self._api = Client(base_url=self.url, api_key=key, http=self.http)
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None


def _key_from_home() -> str | None:
    path = Path(os.environ.get("DPRELEASE_HOME") or "./var") / "admin.key"
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(f"cannot read API key file {path}: {exc}") from exc
    return key or None


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def say(message: str) -> None:
    click.echo(message, err=True)


pass_state = click.make_pass_decorator(CliState, ensure=True)
