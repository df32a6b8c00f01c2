"""Every (mechanism, accountant) pair behind one interface.

An accountant turns a noise scale σ and the mechanism's public keys into an immutable *event*
that knows its ε at any δ, its ledger cost and its description; calibration is the same
monotone search for every accountant. The CLI (`dprelease account`), preview and admission all
go through here, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dpcore.accounting.composition import Cost
from dpcore.calibration import smallest_noise


class Event(Protocol):
    def epsilon(self, delta: float) -> float: ...
    def cost(self, delta: float) -> Cost: ...
    def noise(self) -> dict[str, float]: ...
    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Key:
    """One public input of an accountant (`dprelease account … name=value`)."""

    name: str
    kind: type
    help: str
    required: bool = True
    default: Any = None
    choices: tuple[str, ...] | None = None

    def parse(self, raw: Any) -> Any:
        if self.choices is not None:
            if str(raw) not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}")
            return str(raw)
        if self.kind is int:
            value = float(raw) if isinstance(raw, str) else raw
            if isinstance(value, bool) or float(value) != int(value):
                raise ValueError(f"{self.name} must be an integer, got {raw!r}")
            return int(value)
        if self.kind is float:
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError(f"{self.name} must be finite, got {raw!r}")
            return number
        return self.kind(raw)


Builder = Callable[[float, Mapping[str, Any]], Event]
Guess = Callable[[Mapping[str, Any], float, float], float]
Prepare = Callable[[dict[str, Any], float, float], dict[str, Any]]


@dataclass(frozen=True)
class Accountant:
    mechanism: str
    name: str
    summary: str
    keys: tuple[Key, ...]
    build: Builder = field(repr=False)
    guess: Guess = field(repr=False, default=lambda keys, epsilon, delta: 1.0)
    # False where the analysis misses a case under replace-one neighbours: such an accountant
    # reproduces a paper's number for researchers but may not back a ledger charge.
    valid_bound: bool = True
    caveat: str = ""
    # Fills analysis parameters that depend on the target (ε, δ) before calibrating.
    prepare: Prepare | None = field(repr=False, default=None)

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
        parsed = self.parse_keys(keys)
        if self.prepare is not None:
            parsed = self.prepare(parsed, epsilon, delta)
        sigma, _ = smallest_noise(
            lambda s: self.build(s, parsed).epsilon(delta),
            epsilon,
            initial=self.guess(parsed, epsilon, delta),
        )
        return self.build(sigma, parsed)


REGISTRY: dict[tuple[str, str], Accountant] = {}


def register(accountant: Accountant) -> Accountant:
    REGISTRY[(accountant.mechanism, accountant.name)] = accountant
    return accountant


def get(mechanism: str, name: str) -> Accountant:
    _load()
    try:
        return REGISTRY[(mechanism, name)]
    except KeyError:
        available = ", ".join(f"{m}/{a}" for m, a in sorted(REGISTRY))
        raise ValueError(f"no accountant {mechanism}/{name}; available: {available}") from None


def all_accountants() -> list[Accountant]:
    _load()
    return [REGISTRY[k] for k in sorted(REGISTRY)]


def _load() -> None:
    # Mechanism modules register themselves on import.
    from dpcore.accounting import (  # noqa: F401
        baselines,
        clustmix,
        dpcda,
        dpgm,
        dpmix,
        dpmix_paper,
        sgdrm,
    )
