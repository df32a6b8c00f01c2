"""Parsing of the command-line options: ``-p KEY=VALUE`` parameters, JSON options, and the
options and request body shared by ``release`` and ``preview``."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

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
    """The options shared by ``release`` and ``preview``, passed to the command as one
    ``options: ReleaseOptions``."""
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

    @functools.wraps(func)
    def gathered(*args: Any, **kwargs: Any) -> Any:
        values = {f.name: kwargs.pop(f.name) for f in fields(ReleaseOptions)}
        return func(*args, options=ReleaseOptions(**values), **kwargs)

    command: Callable[..., Any] = gathered
    for option in reversed(options):
        command = option(command)
    return cast(F, command)


@dataclass(frozen=True)
class ReleaseOptions:
    """The values of ``release_options``, as ``release`` and ``preview`` receive them."""

    mechanism: str
    params: Sequence[str]
    epsilon: float | None
    sigma_x: float | None
    sigma_y: float | None
    noise_ratio: float | None
    delta: float | None
    accountant: str | None
    noise_sampler: str | None
    research: bool
    fmt: str

    def body(self, dataset_id: str) -> dict[str, Any]:
        """The request body of ``POST /releases`` and ``POST /releases/preview``."""
        if (self.epsilon is None) == (self.sigma_x is None):
            raise click.UsageError("give exactly one of --epsilon or --sigma-x")
        if self.sigma_y is not None and self.sigma_x is None:
            raise click.UsageError("--sigma-y needs --sigma-x")
        body: dict[str, Any] = {
            "dataset_id": dataset_id,
            "mechanism": self.mechanism,
            "params": parse_params(self.params),
            "format": self.fmt,
        }
        if self.epsilon is not None:
            body["epsilon"] = self.epsilon
        if self.sigma_x is not None:
            noise: dict[str, float] = {"sigma_x": self.sigma_x}
            if self.sigma_y is not None:
                noise["sigma_y"] = self.sigma_y
            body["noise"] = noise
        if self.noise_ratio is not None:
            body["noise_ratio"] = self.noise_ratio
        if self.delta is not None:
            body["delta"] = self.delta
        if self.accountant is not None:
            body["accountant"] = self.accountant
        if self.noise_sampler is not None:
            body["noise_sampler"] = self.noise_sampler
        if self.research:
            body["research"] = True
        return body
