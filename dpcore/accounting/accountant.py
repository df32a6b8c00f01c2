"""An accountant: a mechanism's privacy analysis behind one interface.

An accountant turns a noise scale σ and the mechanism's public keys into an immutable *event*
that knows its ε at any δ, its ledger cost, the Gaussian noise it adds (typed, see
``dpcore.accounting.events``) and its description; calibration is the same monotone search for
every accountant. The CLI (`dprelease account`), preview and admission all go through here, so
they cannot disagree.

This module stays light on purpose (no numpy, scipy or dp_accounting at import): a mechanism's
spec declares its accountants' names, summaries and keys here, and the mathematics behind
``build`` is imported on first use (``lazy``), so `dprelease account --help` starts fast.
"""

from __future__ import annotations

import importlib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

# The contract an accountant returns lives with the events that implement it; mechanisms
# name it from here, next to ``Accountant``.
from dpcore.accounting.events import Event

if TYPE_CHECKING:
    from pydantic import BaseModel


@dataclass(frozen=True)
class Key:
    """One public input of an accountant (`dprelease account … name=value`)."""

    name: str
    kind: type
    help: str
    required: bool = True
    default: Any = None
    choices: tuple[str, ...] | None = None
    # Inclusive lower bound, or exclusive when ``strict`` (from the parameter's Field).
    minimum: float | None = None
    strict: bool = False

    def parse(self, raw: Any) -> Any:
        if self.choices is not None:
            if str(raw) not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}")
            return str(raw)
        if self.kind is int:
            value = float(raw) if isinstance(raw, str) else raw
            if isinstance(value, bool) or float(value) != int(value):
                raise ValueError(f"{self.name} must be an integer, got {raw!r}")
            return self._bounded(int(value))
        if self.kind is float:
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError(f"{self.name} must be finite, got {raw!r}")
            return self._bounded(number)
        return self.kind(raw)

    def _bounded(self, value: float) -> Any:
        low = self.minimum
        if low is not None and (value <= low if self.strict else value < low):
            bound = f"finite and > {low:g}" if self.strict else f">= {low:g}"
            raise ValueError(f"{self.name} must be {bound}, got {value:g}")
        return value

    @classmethod
    def of(
        cls, model: type[BaseModel], name: str, *, help: str | None = None, **overrides: Any
    ) -> Key:
        """The key of a mechanism parameter, from its one definition (the params model's
        field): kind, choices, default and lower bound come from there; ``overrides`` (an
        audit's own default, say) replace them."""
        info = model.model_fields[name]
        kind, choices = _kind(info.annotation)
        minimum, strict = None, False
        for constraint in info.metadata:
            if getattr(constraint, "ge", None) is not None:
                minimum, strict = float(constraint.ge), False
            if getattr(constraint, "gt", None) is not None:
                minimum, strict = float(constraint.gt), True
        required = info.is_required()
        values: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "help": help or info.description or name,
            "required": required,
            "default": None if required else info.get_default(call_default_factory=True),
            "choices": choices,
            "minimum": minimum,
            "strict": strict,
        }
        values.update(overrides)
        if "default" in overrides and "required" not in overrides:
            values["required"] = False
        return cls(**values)


def _kind(annotation: Any) -> tuple[type, tuple[str, ...] | None]:
    """int, float, str or a Literal's choices, from a field's annotation (``X | None`` too)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _kind(args[0])
    if typing.get_origin(annotation) is Literal:
        return str, tuple(str(a) for a in typing.get_args(annotation))
    if annotation in (int, float, str):
        return annotation, None
    raise TypeError(f"a key needs an int, float, str or Literal parameter, not {annotation!r}")


Builder = Callable[[float, Mapping[str, Any]], "Event"]
Guess = Callable[[Mapping[str, Any], float, float], float]
Prepare = Callable[[dict[str, Any], float, float], dict[str, Any]]


def lazy(module: str, attribute: str) -> Callable[..., Any]:
    """A function that imports ``module`` and calls its ``attribute`` on first use (the
    accountants' numerics stay unloaded until someone computes with them)."""
    target: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not target:
            target.append(getattr(importlib.import_module(module), attribute))
        return target[0](*args, **kwargs)

    call.__qualname__ = call.__name__ = f"lazy({module}:{attribute})"
    return call


def _one(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    return 1.0


@dataclass(frozen=True)
class Accountant:
    mechanism: str
    name: str
    summary: str
    keys: tuple[Key, ...]
    build: Builder = field(repr=False)
    guess: Guess = field(repr=False, default=_one)
    # False where the analysis misses a case under replace-one neighbours: such an accountant
    # reproduces a paper's number for researchers but may not back a ledger charge.
    valid_bound: bool = True
    caveat: str = ""
    # False where the analysis is of an algorithm the service never runs (a clustering fixed
    # in advance, say): ``dprelease account`` evaluates it, no release may use it — not even a
    # research release (``valid_bound`` False, owner-only, charged nothing).
    releases: bool = True
    # Fills analysis parameters that depend on the target (ε, δ) before calibrating.
    prepare: Prepare | None = field(repr=False, default=None)
    # Mechanism parameters this accountant does not take as keys because its analysis covers
    # one value only: a release asking for another value is refused, never silently analysed
    # as if it had this one.
    assumes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key_names(self) -> frozenset[str]:
        return frozenset(k.name for k in self.keys)

    def parse_keys(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        known = {k.name: k for k in self.keys}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(
                f"unknown key(s) for {self.mechanism}/{self.name}: {', '.join(unknown)}; "
                f"known: {', '.join(known)}"
            )
        parsed: dict[str, Any] = {}
        for key in self.keys:
            if key.name in raw and raw[key.name] is not None:
                parsed[key.name] = key.parse(raw[key.name])
            elif key.required:
                raise ValueError(f"{self.mechanism}/{self.name} needs key {key.name}: {key.help}")
            else:
                parsed[key.name] = key.default
        return parsed

    def at_sigma(self, sigma: float, keys: Mapping[str, Any]) -> Event:
        return self.build(sigma, self.parse_keys(keys))

    def calibrate(self, epsilon: float, delta: float, keys: Mapping[str, Any]) -> Event:
        """The event with the smallest σ whose ε at δ does not exceed ``epsilon``."""
        from dpcore.calibration import smallest_noise

        parsed = self.parse_keys(keys)
        if self.prepare is not None:
            parsed = self.prepare(parsed, epsilon, delta)
        sigma, _ = smallest_noise(
            lambda s: self.build(s, parsed).epsilon(delta),
            epsilon,
            initial=self.guess(parsed, epsilon, delta),
        )
        return self.build(sigma, parsed)


# Keys of two-scale mechanisms (features and labels noised separately): they come from the
# request, not from the mechanism's parameters.
SIGMA_Y = Key(
    "sigma_y", float, "label noise std when it differs from --sigma (σ_x)", required=False
)
NOISE_RATIO = Key(
    "noise_ratio",
    float,
    "σ_y/σ_x used when calibrating (ignored when sigma_y is set)",
    required=False,
    default=1.0,
)


def sigma_y_of(sigma: float, keys: Mapping[str, Any]) -> float:
    """The label noise of a two-scale mechanism: ``sigma_y`` when given, else
    ``noise_ratio``·σ."""
    if keys.get("sigma_y") is not None:
        return float(keys["sigma_y"])
    return float(keys.get("noise_ratio") or 1.0) * sigma


# The public fact every accountant needs.
N = Key("n", int, "number of records (public)")
