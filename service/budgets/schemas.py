from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class BudgetSummary(BaseModel):
    dataset_id: str
    dataset_name: str
    epsilon: float
    delta: float
    spent: float = Field(description="ε of committed releases under the ledger's filter")
    reserved: float = Field(description="ε of committed and in-flight releases, filter")
    remaining: float = Field(description="epsilon − reserved, rounded down")
    delta_spent: float = Field(description="δ of committed releases under the filter")
    delta_reserved: float = Field(description="δ of committed and in-flight releases")
    delta_remaining: float = Field(description="delta − delta_reserved, rounded down")
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
    charged_as: str = Field(
        description="How the ledger's filter charged it: basic (its (ε, δ) add up) or renyi "
        "(its RDP curve composes in the Rényi group, docs/privacy.md)"
    )
    consumed_epsilon: float = Field(description="What its admission added to the spent ε")
    consumed_delta: float = Field(description="What its admission added to the spent δ")
    state: str = Field(
        description="reserved, committed or refunded; research: an owner-only research release "
        "(its accountant's ε is not a bound), charged nothing and never held by the filter, "
        "listed to the dataset's owner only"
    )
    settled_because: str | None = Field(
        default=None,
        description="Why it was settled so: succeeded, upload_claimed (output may exist) or "
        "private_data_read (a job had begun reading the dataset's content, so whether it "
        "failed may depend on the private data: docs/privacy.md, 'Failures and "
        "cancellations') for a committed entry; before_private_read for a refund; null while "
        "reserved, for a research entry, or for one settled before this was recorded",
    )
    neighbour_relation: str = Field(
        description="The neighbour relation its ε holds for: 'replace-one (n public)', or a "
        "narrower one the release's parameters opted in to (dpcda's class_sizes 'declared')"
    )
    research: str | None = Field(
        default=None,
        description="A research entry's statement in words: what its accountant claimed and "
        "why that is not a bound",
    )
    created_at: datetime
    settled_at: datetime | None
    running_total: float = Field(
        description="The filter's spent ε over this and every earlier non-refunded entry"
    )
    running_delta: float = Field(description="The filter's spent δ over the same entries")


class Ledger(BaseModel):
    dataset_id: str
    epsilon: float
    delta: float
    spent: float
    reserved: float
    remaining: float
    delta_spent: float
    delta_reserved: float
    delta_remaining: float
    entries: list[LedgerEntryOut]
