"""The registry of mechanisms: every spec the service, the worker, the CLI and the benches see.

Built-in mechanisms are the packages named in ``BUILTIN`` (each exposes ``SPEC``), in this
order (the first is the CLI's default). Others join through the ``dprelease.mechanisms``
entry-point group or the ``DPRELEASE_MECHANISM_MODULES`` environment variable (comma-separated
modules that expose ``SPEC``), so a third-party mechanism needs no edit here; tests register
their own with ``register``/``registered``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Iterator
from importlib import metadata

from dpcore.accounting.accountant import Accountant
from dpcore.mechanisms.spec import MechanismSpec, SpecError

# The registry's import list.
BUILTIN = (
    "dpmix",
    "dpcda",
    "sgdrm",
    "local_perturbation",
    "random_projection",
    "clustmix",
    "dpgm",
    "mst",
    "aim",
)
ENTRY_POINT_GROUP = "dprelease.mechanisms"
MODULES_ENV = "DPRELEASE_MECHANISM_MODULES"

_SPECS: dict[str, MechanismSpec] = {}
# The module each loaded spec came from (``module``); specs ``register``ed directly have none.
_MODULES: dict[str, str] = {}
_lock = threading.RLock()
_loaded = False


def _spec_of(module_name: str) -> MechanismSpec:
    spec = getattr(importlib.import_module(module_name), "SPEC", None)
    if not isinstance(spec, MechanismSpec):
        raise SpecError(f"module {module_name} has no SPEC (a MechanismSpec)")
    return spec


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        modules = [f"dpcore.mechanisms.{name}" for name in BUILTIN]
        modules += [
            e.value.partition(":")[0] for e in metadata.entry_points(group=ENTRY_POINT_GROUP)
        ]
        modules += [m.strip() for m in filter(None, os.environ.get(MODULES_ENV, "").split(","))]
        for module in modules:
            _MODULES[_add(_spec_of(module)).name] = module
        _loaded = True


def _add(spec: MechanismSpec) -> MechanismSpec:
    spec.validate()
    with _lock:
        if spec.name in _SPECS and _SPECS[spec.name] is not spec:
            raise SpecError(f"a mechanism named {spec.name!r} is already registered")
        _SPECS[spec.name] = spec
    return spec


def register(spec: MechanismSpec) -> MechanismSpec:
    """Add ``spec`` (validated) to the registry."""
    _load()
    return _add(spec)


def unregister(name: str) -> None:
    with _lock:
        _SPECS.pop(name, None)
        _MODULES.pop(name, None)


@contextlib.contextmanager
def registered(spec: MechanismSpec) -> Iterator[MechanismSpec]:
    """``spec`` is registered inside the block (tests)."""
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec.name)


def specs() -> list[MechanismSpec]:
    _load()
    with _lock:
        return list(_SPECS.values())


def served() -> list[MechanismSpec]:
    """The mechanisms the service runs (those with a release generator)."""
    return [s for s in specs() if s.served]


def names() -> list[str]:
    return [s.name for s in specs()]


def get(name: str) -> MechanismSpec:
    _load()
    with _lock:
        spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"no mechanism {name!r}; known: {', '.join(names())}")
    return spec


def module(name: str) -> str | None:
    """The module mechanism ``name``'s spec was loaded from (its package, where its other
    modules sit, e.g. the benchmarks' hints); None for one ``register``ed directly."""
    get(name)
    with _lock:
        return _MODULES.get(name)


def accountant(mechanism: str, name: str) -> Accountant:
    """``mechanism``'s accountant called ``name`` (ValueError listing what exists)."""
    _load()
    with _lock:
        spec = _SPECS.get(mechanism)
    if spec is None:
        available = ", ".join(f"{a.mechanism}/{a.name}" for a in all_accountants())
        raise ValueError(f"no accountant {mechanism}/{name}; available: {available}")
    try:
        return spec.accountant(name)
    except ValueError:
        available = ", ".join(f"{a.mechanism}/{a.name}" for a in all_accountants())
        raise ValueError(f"no accountant {mechanism}/{name}; available: {available}") from None


def all_accountants() -> list[Accountant]:
    return sorted(
        (a for s in specs() for a in s.accounting.accountants), key=lambda a: (a.mechanism, a.name)
    )
