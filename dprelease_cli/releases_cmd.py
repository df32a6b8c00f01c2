"""The release commands: ``release``, ``preview``, ``status``, ``cancel``, ``releases`` and
``download``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from dprelease_cli.client import TERMINAL_STATUSES, Client, WaitTimeout
from dprelease_cli.common import CliError, CliState, emit, pass_state, say
from dprelease_cli.options import ReleaseOptions, release_options


@click.command()
@click.argument("dataset_id")
@release_options
@click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait for the release to finish."
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Download the artifact here once it succeeds (needs --wait).",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds between status polls (the first ones come sooner: 0.1 s, doubling up to it).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    help="Give up waiting after this many seconds (the release keeps running).",
)
@pass_state
def release(
    state: CliState,
    dataset_id: str,
    options: ReleaseOptions,
    wait: bool,
    output: Path | None,
    poll_interval: float,
    timeout: float | None,
) -> None:
    """Request a release of DATASET_ID, wait for it and optionally download it."""
    if output is not None and not wait:
        raise click.UsageError("--output needs --wait")
    body = options.body(dataset_id)
    api = state.api()
    created = api.create_release(body)
    say(f"release {created.get('id')} {created.get('status')}")
    research_info = created.get("research")
    if research_info:
        say(research_info.get("statement", ""))
    if not wait:
        emit(created)
        return
    final = _wait_for(api, created, poll_interval=poll_interval, timeout=timeout)
    if final.get("status") == "failed":
        emit(final)
        raise CliError(
            f"release {final.get('id')} failed: {_describe_error(final.get('error'))}"
            f"{_settlement_words(final)}"
        )
    if final.get("status") == "cancelled":
        emit(final)
        raise CliError(f"release {final.get('id')} was cancelled{_settlement_words(final)}")
    if output is not None:
        _download(api, final, output)
    emit(final)


# What became of a release's charge, in words (the release's ``settlement``).
SETTLEMENT_WORDS = {
    "succeeded": "its charge is committed",
    "upload_claimed": "its charge stands (committed): its job had begun storing output",
    "private_data_read": "its charge stands (committed): its job had begun reading the "
    "private data, so the failure or the cancel may depend on it (docs/privacy.md, "
    "'Failures and cancellations')",
    "before_private_read": "its charge was refunded: it ended before its job read the data",
}


def _settlement_words(release: Mapping[str, Any]) -> str:
    """'; ' and what became of the charge of an ended release ('' when not known)."""
    settlement = release.get("settlement")
    if not isinstance(settlement, dict) or settlement.get("state") == "reserved":
        return ""
    words = SETTLEMENT_WORDS.get(str(settlement.get("because")))
    return f"; {words}" if words else f"; its charge is {settlement.get('state')}"


def _describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error))
    return str(error) if error else "no reason given"


def _wait_for(
    api: Client, release: Mapping[str, Any], *, poll_interval: float, timeout: float | None
) -> dict[str, Any]:
    """Wait with :meth:`dprelease_client.Client.wait` (its progress bar on stderr): the first
    polls come sooner (from 0.1 s, doubling), then every ``poll_interval`` seconds (no
    further backoff: the user chose the interval)."""
    release_id = str(release.get("id"))
    if release.get("status") in TERMINAL_STATUSES:
        return dict(release)
    try:
        final = api.wait(
            release_id,
            timeout=timeout,
            poll=poll_interval,
            max_poll=poll_interval,
            backoff=2.0,
            progress=True,
            check=False,
        )
    except WaitTimeout as exc:
        emit(exc.detail.get("release"))
        raise CliError(f"{exc.message}, check it with: dprelease status {release_id}") from None
    except KeyboardInterrupt:
        say(
            f"stopped waiting; release {release_id} keeps running on the server "
            f"(dprelease status {release_id})"
        )
        raise click.exceptions.Exit(130) from None
    return dict(final)


def _download(
    api: Client,
    release: Mapping[str, Any],
    output: Path,
    name: str | None = None,
    fmt: str | None = None,
) -> dict[str, Any]:
    release_id = str(release.get("id"))
    artifact = release.get("artifact")
    expected = artifact.get("sha256") if isinstance(artifact, dict) else None
    if not expected:
        raise CliError(
            f"release {release_id} has no artifact to download (status: {release.get('status')})",
            detail={"status": release.get("status"), "progress": release.get("progress")},
        )
    if name is not None:
        further = [a for a in release.get("artifacts") or () if a.get("name") == name]
        if not further:
            listed = [a.get("name") for a in release.get("artifacts") or ()]
            raise CliError(
                f"release {release_id} has no artifact named {name!r}", detail={"names": listed}
            )
        expected = further[0].get("sha256")
    converted = name is None and fmt is not None and fmt != release.get("format")
    try:
        result = api.download_release(
            release_id,
            output,
            expected_sha256=None if converted else expected,
            artifact=name,
            format=fmt if converted else None,
        ).as_json()
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc}") from exc
    if converted:
        say(f"wrote {result['path']} ({result['bytes']} bytes, converted to {fmt} by the server)")
    else:
        say(f"wrote {result['path']} ({result['bytes']} bytes, sha256 verified)")
    return result


@click.command()
@click.argument("dataset_id")
@release_options
@pass_state
def preview(
    state: CliState,
    dataset_id: str,
    options: ReleaseOptions,
) -> None:
    """Show the noise and budget charge a release would have, without running it."""
    body = options.body(dataset_id)
    result = state.api().preview_release(body)
    # Warnings about the budget's δ (what admitting it would leave) go to stderr as well, so a
    # reader of the JSON cannot miss them.
    for warning in result.get("warnings") or []:
        say(f"warning ({warning.get('code')}): {warning.get('message')}")
    emit(result)


@click.command()
@click.argument("release_id")
@pass_state
def status(state: CliState, release_id: str) -> None:
    """Show release RELEASE_ID."""
    result = state.api().get_release(release_id)
    if result.get("status") in ("failed", "cancelled"):
        say(f"release {result.get('id')} {result.get('status')}{_settlement_words(result)}")
    emit(result)


@click.command()
@click.argument("release_id")
@pass_state
def cancel(state: CliState, release_id: str) -> None:
    """Cancel release RELEASE_ID (queued or running). Refunded only if its job had not begun
    reading the private data; its charge stands otherwise."""
    result = state.api().cancel_release(release_id)
    say(f"release {result.get('id')} {result.get('status')}{_settlement_words(result)}")
    emit(result)


@click.command()
@click.option("--dataset-id", help="Only releases of this dataset.")
@pass_state
def releases(state: CliState, dataset_id: str | None) -> None:
    """List releases."""
    emit(state.api().list_releases(dataset_id=dataset_id))


@click.command()
@click.argument("release_id")
@click.option(
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the artifact (atomically).",
)
@click.option(
    "--artifact",
    "name",
    metavar="NAME",
    help="A further file of the release (listed in its `artifacts`) instead of the artifact.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "parquet", "npz"]),
    help="The artifact in this file format (default: the release's own); another format is "
    "converted by the server, at no privacy cost.",
)
@pass_state
def download(
    state: CliState, release_id: str, output: Path, name: str | None, fmt: str | None
) -> None:
    """Download the artifact of RELEASE_ID (or a further file), verifying its sha256 (a
    conversion to another --format has none declared)."""
    api = state.api()
    emit(_download(api, api.get_release(release_id), output, name, fmt))
