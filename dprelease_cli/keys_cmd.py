"""``dprelease keys`` and ``whoami``: API keys and the principal they belong to."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import click

from dprelease_cli.common import ROLES, CliState, emit, pass_state, say


@click.group()
def keys() -> None:
    """Manage API keys."""


_DURATION_UNITS = {"m": 60, "h": 3600, "d": 86400}


def _expires_in(value: str | None) -> int | None:
    """``--expires``: a duration from now (``90m``, ``12h``, ``30d``) or an ISO 8601 instant
    with its time zone; sent as seconds from now."""
    if value is None:
        return None
    unit = value[-1:].lower()
    if unit in _DURATION_UNITS and value[:-1].isdigit() and int(value[:-1]) > 0:
        return int(value[:-1]) * _DURATION_UNITS[unit]
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        instant = None
    if instant is None or instant.tzinfo is None:
        raise click.BadParameter(
            "a duration (90m, 12h, 30d) or an ISO 8601 time with its zone "
            "(2027-01-31T00:00:00+00:00)",
            param_hint="--expires",
        )
    seconds = math.ceil((instant - datetime.now(UTC)).total_seconds())
    if seconds < 1:
        raise click.BadParameter("that time has passed", param_hint="--expires")
    return seconds


@keys.command("create")
@click.option("--name", help="Name of the new principal.")
@click.option("--role", type=click.Choice(ROLES), help="Role of the new principal.")
@click.option(
    "--principal",
    "principal_id",
    help="Instead of --name/--role: another key for this existing principal (rotation).",
)
@click.option(
    "--expires",
    help="Refuse the key from then on: a duration (90m, 12h, 30d) or an ISO 8601 time.",
)
@pass_state
def keys_create(
    state: CliState,
    name: str | None,
    role: str | None,
    principal_id: str | None,
    expires: str | None,
) -> None:
    """Create an API key (the key is shown once)."""
    if principal_id is not None and (name is not None or role is not None):
        raise click.UsageError("give either --principal, or --name and --role")
    if principal_id is None and (name is None or role is None):
        raise click.UsageError("a new principal needs --name and --role (or give --principal)")
    created = state.api().create_api_key(
        name=name, role=role, principal_id=principal_id, expires_in=_expires_in(expires)
    )
    say("store the key now: it cannot be shown again")
    emit(created)


@keys.command("list")
@pass_state
def keys_list(state: CliState) -> None:
    """List API keys, never their secrets (admin: every key; owner, analyst: their own)."""
    emit(state.api().list_api_keys())


@keys.command("revoke")
@click.argument("key_id")
@pass_state
def keys_revoke(state: CliState, key_id: str) -> None:
    """Revoke KEY_ID: its next request is refused (admin: any key but the last active admin
    key; owner, analyst: their own keys)."""
    state.api().revoke_api_key(key_id)
    emit({"revoked": key_id})


@click.command()
@pass_state
def whoami(state: CliState) -> None:
    """Show the principal the key belongs to."""
    emit(state.api().me())
