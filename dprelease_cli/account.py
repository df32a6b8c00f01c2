"""``dprelease account``: the service's accountants, offline, for researchers and auditors."""

from __future__ import annotations

import json
from typing import Any

import click


def _keys_help() -> str:
    # The registry holds names, summaries and keys only: no accountant's numerics load here.
    from dpcore.mechanisms import registry

    lines = ["\b", "Keys (KEY=VALUE) per mechanism and accountant:"]
    for acc in registry.all_accountants():
        lines.append(f"  {acc.mechanism} --accountant {acc.name}: {acc.summary}")
        if not acc.valid_bound:
            lines.append(f"      (not a valid bound: {acc.caveat})")
        for key in acc.keys:
            optional = "" if key.required else f" (optional, default {key.default})"
            choices = f" [{'|'.join(key.choices)}]" if key.choices else ""
            lines.append(f"      {key.name}{choices}: {key.help}{optional}")
    return "\n".join(lines)


def _parse_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.UsageError(f"expected KEY=VALUE, got {pair!r}")
        if name in out:
            raise click.UsageError(f"key {name!r} given twice")
        out[name] = value
    return out


class _AccountCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_paragraph()
        for line in _keys_help().splitlines():
            formatter.write(line + "\n")


@click.command("account", cls=_AccountCommand)
@click.argument("mechanism")
@click.argument("pairs", nargs=-1, metavar="KEY=VALUE...")
@click.option(
    "--accountant",
    default="tight",
    show_default=True,
    help="The mechanism's accountant: tight (dprelease's tightest valid analysis), paper (the "
    "paper's own), or another the mechanism lists below.",
)
@click.option("--delta", type=float, required=True, help="δ at which ε is reported.")
@click.option(
    "--sigma",
    type=float,
    help="The calibrated noise scale (σ_x where features and labels have their own): report its ε.",
)
@click.option("--epsilon", type=float, help="Target ε: report the smallest noise meeting it.")
def account(
    mechanism: str,
    pairs: tuple[str, ...],
    accountant: str,
    delta: float,
    sigma: float | None,
    epsilon: float | None,
) -> None:
    """Privacy cost of MECHANISM without a server: ε for a given noise (--sigma) or the
    smallest noise for a target ε (--epsilon). Prints one JSON object."""
    if (sigma is None) == (epsilon is None):
        raise click.UsageError("give exactly one of --sigma or --epsilon")
    from dpcore.mechanisms import registry
    from dpcore.mechanisms.planning import Target

    try:
        acc = registry.accountant(mechanism, accountant)
        target = Target(accountant, epsilon=epsilon, sigma=sigma, delta=delta)
        event = target.event(acc, _parse_pairs(pairs))
        result: dict[str, Any] = {
            "mechanism": mechanism,
            "accountant": accountant,
            "epsilon": event.epsilon(delta),
            "delta": delta,
            "noise": event.noise().to_json(),
            "target_epsilon": epsilon,
            "valid_upper_bound": acc.valid_bound,
            **({"caveat": acc.caveat} if acc.caveat else {}),
            "event": event.describe(),
        }
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(result, indent=2))
