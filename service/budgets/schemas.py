from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class BudgetSummary(BaseModel):
    dataset_id: str
    dataset_name: str
    epsilon: float
    delta: float
    spent: float = Field(description="Committed releases, composed at the budget's δ")
    reserved: float = Field(description="Committed and in-flight releases, composed")
    remaining: float = Field(description="epsilon − reserved, rounded down")
    release_count: int = Field(description="Releases holding or having spent budget")


class BudgetList(BaseModel):
    items: list[BudgetSummary]


class LedgerEntryOut(BaseModel):
    release_id: str
    mechanism: str
    params: dict[str, Any]
    accountant: str
    epsilon: float = Field(description="This release's own ε at its δ")
    delta: float
    state: str = Field(description="reserved, committed or refunded")
    created_at: datetime
    settled_at: datetime | None
    running_total: float = Field(
        description="Composed ε of this and every earlier non-refunded entry, at the budget's δ"
    )


class Ledger(BaseModel):
    dataset_id: str
    epsilon: float
    delta: float
    spent: float
    reserved: float
    remaining: float
    entries: list[LedgerEntryOut]
