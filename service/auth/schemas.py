from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, Field

from service.strict_json import FROM_JSON, JSON_NUMBER, StrictBody


class Role(StrEnum):
    owner = "owner"
    analyst = "analyst"
    admin = "admin"


MAX_EXPIRES_IN = 10 * 365 * 86400  # ten years, in seconds

ExpiresIn = Annotated[
    Annotated[int, Field(ge=1, le=MAX_EXPIRES_IN), FROM_JSON, JSON_NUMBER] | None,
    Field(description="Seconds from now until the key is refused (default: never expires)"),
]


class NewPrincipalKey(StrictBody):
    """A new principal and its key."""

    name: str = Field(min_length=1, max_length=200, description="Who the key is for")
    role: Annotated[Role, FROM_JSON]
    expires_in: ExpiresIn = None


class PrincipalKey(StrictBody):
    """Another key for an existing principal: to rotate a key, create its successor, then
    revoke the old one (the principal's datasets, grants and releases stay)."""

    principal_id: str = Field(description="The principal that gets another key")
    expires_in: ExpiresIn = None


ApiKeyCreate = NewPrincipalKey | PrincipalKey


class ApiKeyCreated(BaseModel):
    principal_id: str
    key_id: str
    name: str
    role: Role
    key: str = Field(description="The secret; shown once, stored only as a hash")
    created_at: datetime
    expires_at: datetime | None = None


class ApiKeyOut(BaseModel):
    """A key as listed: never its secret, hash or prefix."""

    id: str
    principal_id: str
    name: str
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    bootstrap: bool = Field(description="The start-up admin key (DPRELEASE_ADMIN_KEY)")
    active: bool = Field(description="Neither revoked nor expired")


class ApiKeyList(BaseModel):
    items: list[ApiKeyOut]


class Me(BaseModel):
    principal_id: str
    name: str
    role: Role
