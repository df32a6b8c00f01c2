"""Parsing of the command-line options: ``-p KEY=VALUE`` parameters, JSON options, and the
options and request body shared by ``release`` and ``preview``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from dprelease_cli.common import DEFAULT_MECHANISM, FORMATS

F = TypeVar("F", bound=Callable[..., Any])


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


def json_option(text: str | None, *, hint: str, kinds: tuple[type, ...]) -> Any:
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
