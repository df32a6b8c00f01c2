from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

ObjectType = Literal["api_key", "dataset", "grant", "release"]

_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _rfc3339(value: object) -> object:
    # Pydantic would also take numbers (Unix time) and dates without a time or an offset.
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2026-01-01T00:00:00Z")
    return value


Since = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


class AuditQuery(BaseModel):
    # An unknown parameter is refused: a misspelt filter must not return everything.
    model_config = ConfigDict(extra="forbid")

    object_type: ObjectType | None = None
    object_id: str | None = Field(default=None, max_length=64)
    actor: str | None = Field(
        default=None, max_length=64, description="Principal id, 'worker' or 'system'"
    )
    since: Since | None = Field(
        default=None, description="Events at or after this RFC 3339 time, e.g. 2026-01-01T00:00:00Z"
    )
    cursor: str | None = Field(
        default=None, pattern=r"^[0-9]{1,18}$", description="next_cursor of the previous page"
    )
    limit: int = Field(default=100, ge=1, le=500)


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
