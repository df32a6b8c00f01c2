"""The ``dprelease`` command-line client.

Every command prints its result as JSON (indent 2) on stdout so scripts can parse it; human
messages and the progress bar go to stderr. Failures print ``error: <message>`` (plus the
error's detail as JSON when there is one) on stderr and exit with status 1.

The API client (:mod:`dprelease_client`, httpx only) is created lazily by
:meth:`CliState.api`, so a subcommand that never calls it (an offline one) needs neither a key
nor a reachable server. Tests inject an HTTP client with
``runner.invoke(cli, args, obj=CliState(http=httpx.Client(transport=...)))``.

Start-up stays light: importing this module loads neither numpy, torch nor dpcore (a test
checks it). The offline commands that need them are registered by name in ``_LAZY_COMMANDS``
and imported only when run (or asked for their own --help).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import click
import httpx

from dprelease_cli.client import TERMINAL_STATUSES, ApiError, Client, WaitTimeout

DEFAULT_URL = "http://127.0.0.1:8000"
NO_KEY_MESSAGE = "no API key: pass --key or set DPRELEASE_KEY"
ROLES = ("owner", "analyst", "admin")
FORMATS = ("npz", "csv", "parquet")
# The registry's first built-in (dpcore.mechanisms.registry.BUILTIN[0]; a test keeps them
# equal): named here so that `dprelease --help` does not import dpcore.
DEFAULT_MECHANISM = "dpmix"

F = TypeVar("F", bound=Callable[..., Any])


# -- plumbing ------------------------------------------------------------------------------


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


# Offline commands whose module imports numpy/dpcore (evaluate: torch, scikit-learn): name ->
# (module, attribute, short help). The module is imported only when the command is looked up
# to run; `dprelease --help` lists it with the short help given here (a test checks it equals
# the command's own).
_LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "evaluate": (
        "dprelease_cli.evaluate_cmd",
        "evaluate_command",
        "Train classifiers on a RELEASE (NPZ, CSV or Parquet, as the service writes it) and "
        "report each one's accuracy, balanced accuracy and ROC AUC on real test data, beside a "
        "majority-class row (the release's most frequent class) and, with --reference, the "
        "same models trained on real records.",
    ),
}


class _Group(click.Group):
    """Turns API errors raised anywhere below into :class:`CliError`; loads the commands of
    ``_LAZY_COMMANDS`` on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module, attr, _ = _LAZY_COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with the lazy commands' short help taken from
        ``_LAZY_COMMANDS`` instead of importing them."""
        rows: list[tuple[str, str]] = []
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        for name in names:
            if name in _LAZY_COMMANDS and name not in self.commands:
                rows.append(
                    (
                        name,
                        click.Command(name, help=_LAZY_COMMANDS[name][2]).get_short_help_str(limit),
                    )
                )
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            raise CliError(exc.message, detail=exc.detail) from exc


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def say(message: str) -> None:
    click.echo(message, err=True)


pass_state = click.make_pass_decorator(CliState, ensure=True)


# -- option parsing ------------------------------------------------------------------------


def parse_value(text: str) -> bool | int | float | str:
    """``-p`` values: ``true``/``false`` a bool, else an int, else a finite float, else the
    string as given (the service takes JSON booleans only for flags such as dpgm's
    ``weights``)."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def parse_params(items: Sequence[str]) -> dict[str, bool | int | float | str]:
    params: dict[str, bool | int | float | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="-p/--param")
        if key in params:
            raise click.BadParameter(f"{key!r} given twice", param_hint="-p/--param")
        params[key] = parse_value(raw)
    return params


def _json_option(text: str | None, *, hint: str, kinds: tuple[type, ...]) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=hint) from exc
    if not isinstance(value, kinds):
        names = " or ".join("a list" if k is list else "an object" for k in kinds)
        raise click.BadParameter(f"must be {names}", param_hint=hint)
    return value


def release_options(func: F) -> F:
    """The options shared by ``release`` and ``preview``."""
    options = [
        click.option(
            "--mechanism",
            default=DEFAULT_MECHANISM,
            show_default=True,
            help="Mechanism name (GET /mechanisms lists them).",
        ),
        click.option(
            "-p",
            "--param",
            "params",
            multiple=True,
            metavar="KEY=VALUE",
            help="Mechanism parameter (repeatable); values parse as int, float, else string.",
        ),
        click.option("--epsilon", type=float, help="Target ε (the service calibrates noise)."),
        click.option("--sigma-x", type=float, help="Explicit feature noise σx (instead of ε)."),
        click.option("--sigma-y", type=float, help="Explicit label noise σy (with --sigma-x)."),
        click.option("--noise-ratio", type=float, help="σy/σx ratio used when calibrating."),
        click.option("--delta", type=float, help="δ at which ε is measured."),
        click.option("--accountant", help="Privacy accountant to use."),
        click.option(
            "--noise-sampler",
            type=click.Choice(["secure", "fast"]),
            help="secure (the service's default): lattice + CSPRNG noise; fast: torch floats.",
        ),
        click.option(
            "--research",
            is_flag=True,
            default=False,
            help="Opt in to an owner-only research release, charged nothing: required by an "
            "accountant whose ε is not a valid bound (e.g. clustmix -p variant=paper "
            "--accountant paper); its ε is reported as a claim only.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
            default="npz",
            show_default=True,
            help="Artifact format.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_release_body(
    dataset_id: str,
    *,
    mechanism: str,
    params: Sequence[str],
    epsilon: float | None,
    sigma_x: float | None,
    sigma_y: float | None,
    noise_ratio: float | None,
    delta: float | None,
    accountant: str | None,
    fmt: str,
    noise_sampler: str | None = None,
    research: bool = False,
) -> dict[str, Any]:
    if (epsilon is None) == (sigma_x is None):
        raise click.UsageError("give exactly one of --epsilon or --sigma-x")
    if sigma_y is not None and sigma_x is None:
        raise click.UsageError("--sigma-y needs --sigma-x")
    body: dict[str, Any] = {
        "dataset_id": dataset_id,
        "mechanism": mechanism,
        "params": parse_params(params),
        "format": fmt,
    }
    if epsilon is not None:
        body["epsilon"] = epsilon
    if sigma_x is not None:
        noise: dict[str, float] = {"sigma_x": sigma_x}
        if sigma_y is not None:
            noise["sigma_y"] = sigma_y
        body["noise"] = noise
    if noise_ratio is not None:
        body["noise_ratio"] = noise_ratio
    if delta is not None:
        body["delta"] = delta
    if accountant is not None:
        body["accountant"] = accountant
    if noise_sampler is not None:
        body["noise_sampler"] = noise_sampler
    if research:
        body["research"] = True
    return body


# -- the group -----------------------------------------------------------------------------


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="DPRELEASE_URL",
    default=DEFAULT_URL,
    show_default=True,
    show_envvar=True,
    help="Base URL of the dprelease API.",
)
@click.option(
    "--key",
    envvar="DPRELEASE_KEY",
    show_envvar=True,
    help="API key; if unset, ${DPRELEASE_HOME:-./var}/admin.key is read when it exists.",
)
@click.pass_context
def cli(ctx: click.Context, url: str, key: str | None) -> None:
    """Client for the dprelease differentially private release service.

    Results are printed as JSON on stdout; messages and progress go to stderr.
    """
    state = ctx.ensure_object(CliState)
    state.url = url
    state.key = key
    ctx.call_on_close(state.close)


# -- identity ------------------------------------------------------------------------------


@cli.group()
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


@cli.command()
@pass_state
def whoami(state: CliState) -> None:
    """Show the principal the key belongs to."""
    emit(state.api().me())


# -- datasets ------------------------------------------------------------------------------


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="Dataset name.")
@click.option("--label-column", help="CSV/Parquet: the column holding the labels.")
@click.option(
    "--feature-range",
    type=(float, float),
    metavar="LO HI",
    help="Public bounds for every feature.",
)
@click.option(
    "--feature-range-json",
    metavar="JSON",
    help="Per-column bounds, e.g. '{\"age\": [0, 120]}' (or a [lo, hi] list).",
)
@click.option(
    "--columns",
    "columns_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CSV/Parquet: a JSON file declaring every feature column (numeric with bounds, or "
    "categorical with its categories, each with an optional missing-value policy): "
    "docs/guide.md, Datasets. Instead of --feature-range.",
)
@click.option(
    "--classes",
    metavar="JSON_LIST",
    help="Declared label set, every class, e.g. '[0, 1]'. Without it the dataset takes no "
    "release (the labels in the file are private).",
)
@click.option("--epsilon", type=float, required=True, help="Total ε budget of the dataset.")
@click.option("--delta", type=float, required=True, help="δ of the dataset's budget.")
@pass_state
def upload(
    state: CliState,
    file: Path,
    name: str,
    label_column: str | None,
    feature_range: tuple[float, float] | None,
    feature_range_json: str | None,
    columns_file: Path | None,
    classes: str | None,
    epsilon: float,
    delta: float,
) -> None:
    """Upload a dataset FILE (npz, csv or parquet) with its public metadata and budget."""
    given = [feature_range, feature_range_json, columns_file]
    if sum(g is not None for g in given) != 1:
        raise click.UsageError(
            "give exactly one of --feature-range, --feature-range-json or --columns"
        )
    metadata: dict[str, Any] = {"name": name}
    if columns_file is not None:
        try:
            metadata["columns"] = json.loads(columns_file.read_text())
        except (OSError, ValueError) as exc:
            raise click.UsageError(f"--columns: {columns_file} is not JSON ({exc})") from exc
    else:
        metadata["feature_range"] = (
            list(feature_range)
            if feature_range is not None
            else _json_option(feature_range_json, hint="--feature-range-json", kinds=(list, dict))
        )
    if label_column is not None:
        metadata["label_column"] = label_column
    declared = _json_option(classes, hint="--classes", kinds=(list,))
    if declared is not None:
        metadata["classes"] = declared
    metadata["budget"] = {"epsilon": epsilon, "delta": delta}
    api = state.api()
    say(f"uploading {file} ({file.stat().st_size} bytes)")
    with file.open("rb") as fh:
        dataset = api.upload_dataset(fh, filename=file.name, metadata=metadata)
    clipped = dataset.get("clipped_values")
    if clipped:
        say(f"note: {clipped} feature values were outside feature_range and were clipped")
    if dataset.get("classes_declared_by_owner") is False:
        say(
            "note: no --classes declared: the labels found are shown to you only, and releases "
            "of this dataset are refused; upload it again with --classes to release from it"
        )
    emit(dataset)


@cli.command("idx-to-npz")
@click.argument("images", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("labels", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
def idx_to_npz_command(images: Path, labels: Path, output: Path) -> None:
    """Convert IDX image and label files (e.g. MNIST, gzipped or not) to an NPZ with X and y
    (works offline)."""
    from dprelease_cli.idx import idx_to_npz

    try:
        payload = idx_to_npz(images, labels)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    output.write_bytes(payload)
    emit({"path": str(output), "bytes": len(payload)})


@cli.command()
@click.argument("dataset_id", required=False)
@pass_state
def datasets(state: CliState, dataset_id: str | None) -> None:
    """List datasets, or show DATASET_ID."""
    api = state.api()
    emit(api.get_dataset(dataset_id) if dataset_id else api.list_datasets())


@cli.command()
@click.argument("dataset_id")
@click.argument("principal_id")
@pass_state
def grant(state: CliState, dataset_id: str, principal_id: str) -> None:
    """Let PRINCIPAL_ID (an analyst) read and download the releases of DATASET_ID."""
    emit(state.api().grant(dataset_id, principal_id))


@cli.command()
@click.argument("dataset_id")
@pass_state
def grants(state: CliState, dataset_id: str) -> None:
    """List the analysts granted DATASET_ID (owner, admin)."""
    emit(state.api().list_grants(dataset_id))


@cli.command()
@click.argument("dataset_id")
@click.argument("grant_id")
@pass_state
def revoke(state: CliState, dataset_id: str, grant_id: str) -> None:
    """Revoke GRANT_ID of DATASET_ID: its analyst no longer sees the releases."""
    state.api().revoke_grant(dataset_id, grant_id)
    emit({"revoked": grant_id, "dataset_id": dataset_id})


@cli.command()
@click.argument("dataset_id")
@click.option("--yes", is_flag=True, help="Confirm: the raw data is erased for good.")
@pass_state
def delete(state: CliState, dataset_id: str, yes: bool) -> None:
    """Delete DATASET_ID: erase its raw data; its ledger and releases stay (owner)."""
    if not yes:
        raise click.UsageError("deleting erases the raw data for good; add --yes to confirm")
    emit(state.api().delete_dataset(dataset_id))


# -- releases ------------------------------------------------------------------------------


@cli.command()
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
    mechanism: str,
    params: tuple[str, ...],
    epsilon: float | None,
    sigma_x: float | None,
    sigma_y: float | None,
    noise_ratio: float | None,
    delta: float | None,
    accountant: str | None,
    noise_sampler: str | None,
    research: bool,
    fmt: str,
    wait: bool,
    output: Path | None,
    poll_interval: float,
    timeout: float | None,
) -> None:
    """Request a release of DATASET_ID, wait for it and optionally download it."""
    if output is not None and not wait:
        raise click.UsageError("--output needs --wait")
    body = build_release_body(
        dataset_id,
        mechanism=mechanism,
        params=params,
        epsilon=epsilon,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        noise_ratio=noise_ratio,
        delta=delta,
        accountant=accountant,
        fmt=fmt,
        noise_sampler=noise_sampler,
        research=research,
    )
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
    api: Client, release: Mapping[str, Any], output: Path, name: str | None = None
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
    try:
        result = api.download_release(
            release_id, output, expected_sha256=expected, artifact=name
        ).as_json()
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc}") from exc
    say(f"wrote {result['path']} ({result['bytes']} bytes, sha256 verified)")
    return result


@cli.command()
@click.argument("dataset_id")
@release_options
@pass_state
def preview(
    state: CliState,
    dataset_id: str,
    mechanism: str,
    params: tuple[str, ...],
    epsilon: float | None,
    sigma_x: float | None,
    sigma_y: float | None,
    noise_ratio: float | None,
    delta: float | None,
    accountant: str | None,
    noise_sampler: str | None,
    research: bool,
    fmt: str,
) -> None:
    """Show the noise and budget charge a release would have, without running it."""
    body = build_release_body(
        dataset_id,
        mechanism=mechanism,
        params=params,
        epsilon=epsilon,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        noise_ratio=noise_ratio,
        delta=delta,
        accountant=accountant,
        fmt=fmt,
        noise_sampler=noise_sampler,
        research=research,
    )
    result = state.api().preview_release(body)
    # Warnings about the budget's δ (what admitting it would leave) go to stderr as well, so a
    # reader of the JSON cannot miss them.
    for warning in result.get("warnings") or []:
        say(f"warning ({warning.get('code')}): {warning.get('message')}")
    emit(result)


@cli.command()
@click.argument("release_id")
@pass_state
def status(state: CliState, release_id: str) -> None:
    """Show release RELEASE_ID."""
    result = state.api().get_release(release_id)
    if result.get("status") in ("failed", "cancelled"):
        say(f"release {result.get('id')} {result.get('status')}{_settlement_words(result)}")
    emit(result)


@cli.command()
@click.argument("release_id")
@pass_state
def cancel(state: CliState, release_id: str) -> None:
    """Cancel release RELEASE_ID (queued or running). Refunded only if its job had not begun
    reading the private data; its charge stands otherwise."""
    result = state.api().cancel_release(release_id)
    say(f"release {result.get('id')} {result.get('status')}{_settlement_words(result)}")
    emit(result)


@cli.command()
@click.option("--dataset-id", help="Only releases of this dataset.")
@pass_state
def releases(state: CliState, dataset_id: str | None) -> None:
    """List releases."""
    emit(state.api().list_releases(dataset_id=dataset_id))


@cli.command()
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
@pass_state
def download(state: CliState, release_id: str, output: Path, name: str | None) -> None:
    """Download the artifact of RELEASE_ID (or a further file), verifying its sha256."""
    api = state.api()
    emit(_download(api, api.get_release(release_id), output, name))


# -- budgets -------------------------------------------------------------------------------


@cli.command()
@click.argument("dataset_id", required=False)
@pass_state
def budgets(state: CliState, dataset_id: str | None) -> None:
    """List budgets, or show the ledger of DATASET_ID."""
    api = state.api()
    result: dict[str, Any] = dict(api.get_budget(dataset_id) if dataset_id else api.list_budgets())
    # A line per dataset on stderr: what remains of ε and of δ (both budgets under the
    # ledger's filter); stdout keeps the JSON.
    for item in result.get("items") or [result]:
        say(_budget_line(item))
    emit(result)


def _budget_line(item: dict[str, Any]) -> str:
    def number(key: str, spec: str) -> str:
        value = item.get(key)
        return format(value, spec) if isinstance(value, int | float) else "?"

    name = item.get("dataset_name") or item.get("dataset_id")
    return (
        f"{name}: remaining ε = {number('remaining', '.6g')} of {number('epsilon', 'g')}, "
        f"δ = {number('delta_remaining', '.3g')} of {number('delta', 'g')}"
    )


from dprelease_cli.account import account  # noqa: E402  (offline subcommands, light)
from dprelease_cli.audit_cmd import audit_command  # noqa: E402

cli.add_command(account)
cli.add_command(audit_command)


def main() -> None:
    cli.main(prog_name="dprelease")


if __name__ == "__main__":
    main()
