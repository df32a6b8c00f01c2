"""``dprelease audit``: an empirical lower bound on ε from running a mechanism (offline)."""

from __future__ import annotations

import json
from typing import Any

import click

from dprelease_cli.account import _parse_pairs


def _audited() -> list[Any]:
    from dpcore.mechanisms import registry

    return [s for s in registry.specs() if s.audit is not None]


def _keys_help() -> str:
    lines = ["\b", "Keys (KEY=VALUE) per mechanism, with the audit's defaults:"]
    for spec in _audited():
        lines.append(f"  {spec.name}:")
        for key in spec.audit.keys:
            choices = f" [{'|'.join(key.choices)}]" if key.choices else ""
            lines.append(f"      {key.name}{choices}: {key.help} (default {key.default})")
    return "\n".join(lines)


class _AuditCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_paragraph()
        for line in _keys_help().splitlines():
            formatter.write(line + "\n")


@click.command("audit", cls=_AuditCommand)
@click.argument("mechanism")
@click.argument("pairs", nargs=-1, metavar="KEY=VALUE...")
@click.option("--epsilon", type=float, help="Claimed ε: audit the noise calibrated for it.")
@click.option("--sigma", type=float, help="Audit this noise scale (σ_x; its ε is the claim).")
@click.option(
    "--delta",
    type=float,
    default=1e-2,
    show_default=True,
    help="δ of the claim (small δ needs about 1/δ trials to matter).",
)
@click.option(
    "--trials",
    type=click.IntRange(min=4),
    default=40_000,
    show_default=True,
    help="Releases of each neighbour: half pick the threshold, half bound ε.",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="The bound holds with confidence 1 − alpha.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--noise-sampler",
    type=click.Choice(["fast", "secure"]),
    default="fast",
    show_default=True,
    help="fast is reproducible from --seed; secure is the release default (OS CSPRNG).",
)
def audit_command(
    mechanism: str,
    pairs: tuple[str, ...],
    epsilon: float | None,
    sigma: float | None,
    delta: float,
    trials: int,
    alpha: float,
    seed: int,
    noise_sampler: str,
) -> None:
    """Run MECHANISM's real code on worst-case neighbouring datasets many times and print
    a Clopper–Pearson lower bound on ε next to the ε its accountant claims (one JSON object).

    A lower bound above the claim means the implementation or the accountant is wrong; one
    below it proves nothing more than that this test found no violation (docs/privacy.md,
    "Empirical audits")."""
    # Checked here, not by a click.Choice, so mechanisms registered after import count too.
    audited = sorted(s.name for s in _audited())
    if mechanism not in audited:
        raise click.BadParameter(
            f"{mechanism!r} is not one of {', '.join(map(repr, audited))}",
            param_hint="'MECHANISM'",
        )
    if (sigma is None) == (epsilon is None):
        raise click.UsageError("give exactly one of --sigma or --epsilon")
    from dpcore.audit import run_audit

    try:
        result = run_audit(
            mechanism,
            _parse_pairs(pairs),
            delta=delta,
            epsilon=epsilon,
            sigma=sigma,
            trials=trials,
            alpha=alpha,
            seed=seed,
            noise_sampler=noise_sampler,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(result, indent=2))
