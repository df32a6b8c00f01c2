"""What the benchmarks read of a mechanism: a ``BENCH`` (``BenchHints``) in its package's
``bench`` module, beside its spec rather than in it (``bench/hints.py`` collects them
through the registry)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchCase:
    """A calibration benchmark case: ``accountant`` at (ε, δ) with these keys."""

    accountant: str
    epsilon: float
    delta: float
    keys: Mapping[str, Any]


@dataclass(frozen=True)
class BenchHints:
    """``sweet_spot(ell, n, min_class_size)``: the params of the MNIST sweet-spot study at
    mixture degree ``ell`` (None when ``sweep`` is None: the mechanism has no such knob);
    ``calibration``: the calibration benchmark's cases."""

    sweep: str | None = None
    sweet_spot: Callable[[int | None, int, int], dict[str, Any]] | None = None
    max_sweep: Callable[[int, int], int] | None = None
    calibration: tuple[BenchCase, ...] = ()
