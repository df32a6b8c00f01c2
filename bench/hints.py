"""Each mechanism's benchmark hints, found through the registry: the ``BENCH``
(``dpcore.mechanisms.bench_hints.BenchHints``) of the ``bench`` module beside its spec. A
mechanism without one (a test's, a plugin's) has none: no sweet spot, no calibration cases."""

from __future__ import annotations

import importlib

from dpcore.mechanisms import registry
from dpcore.mechanisms.bench_hints import BenchHints

NONE = BenchHints()


def of(mechanism: str) -> BenchHints:
    """``mechanism``'s hints (``NONE`` where its package has no ``bench`` module)."""
    package = registry.module(mechanism)
    if package is None:
        return NONE
    try:
        module = importlib.import_module(f"{package}.bench")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.bench":
            raise
        return NONE
    hints = getattr(module, "BENCH", NONE)
    if not isinstance(hints, BenchHints):
        raise TypeError(f"{package}.bench.BENCH is not a BenchHints")
    return hints
