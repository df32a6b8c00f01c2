from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

ObjectType = Literal["api_key", "dataset", "grant", "release"]


class AuditEventOut(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description="Principal id, or 'worker' (jobs) or 'system' (start-up)")
    action: str = Field(description="What happened, e.g. dataset.created, release.succeeded")
    object_type: ObjectType
    object_id: str
    detail: dict[str, Any] = Field(description="Small facts; never secrets or raw-data figures")


class AuditPage(BaseModel):
    items: list[AuditEventOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (newer) events; null: nothing more now"
    )
