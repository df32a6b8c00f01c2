"""Privacy accountants (replace-one neighbours, n public) and ledger composition.

Names load on first use: ``dpcore.accounting.accountant`` (what mechanism specs import) stays
free of numpy, scipy and dp_accounting."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ORDERS", "Cost", "compose_epsilon", "epsilon_from_rdp", "gdp"]

_HOMES = {
    "Cost": "dpcore.accounting.composition",
    "compose_epsilon": "dpcore.accounting.composition",
    "ORDERS": "dpcore.accounting.orders",
    "epsilon_from_rdp": "dpcore.accounting.orders",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    if name in ("gdp", "composition", "orders", "wor_gaussian", "events", "accountant"):
        return importlib.import_module(f"dpcore.accounting.{name}")
    raise AttributeError(f"module 'dpcore.accounting' has no attribute {name!r}")
