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

from typing import Any

import click

from dprelease_cli.account import account
from dprelease_cli.audit_cmd import audit_command
from dprelease_cli.client import ApiError
from dprelease_cli.common import (
    DEFAULT_MECHANISM,
    DEFAULT_URL,
    CliError,
    CliState,
)
from dprelease_cli.datasets_cmd import (
    budgets,
    datasets,
    delete,
    grant,
    grants,
    idx_to_npz_command,
    revoke,
    upload,
)
from dprelease_cli.keys_cmd import keys, whoami
from dprelease_cli.options import parse_params, parse_value
from dprelease_cli.releases_cmd import cancel, download, preview, release, releases, status

__all__ = ["DEFAULT_MECHANISM", "CliState", "cli", "main", "parse_params", "parse_value"]


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


for _command in (
    keys,
    whoami,
    upload,
    idx_to_npz_command,
    datasets,
    grant,
    grants,
    revoke,
    delete,
    release,
    preview,
    status,
    cancel,
    releases,
    download,
    budgets,
    account,
    audit_command,
):
    cli.add_command(_command)


def main() -> None:
    cli.main(prog_name="dprelease")


if __name__ == "__main__":
    main()
