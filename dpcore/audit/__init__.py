"""Empirical privacy audits: lower bounds on ε from running the real mechanisms.

Submodules load on first use, so a spec can import ``dpcore.audit.keys`` without torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["parse_params", "releases", "run_audit", "stats"]


def __getattr__(name: str) -> Any:
    if name == "stats":
        return importlib.import_module("dpcore.audit.stats")
    if name in ("parse_params", "releases", "run_audit"):
        return getattr(importlib.import_module("dpcore.audit.harness"), name)
    raise AttributeError(f"module 'dpcore.audit' has no attribute {name!r}")
