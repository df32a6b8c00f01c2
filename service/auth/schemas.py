from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Role(StrEnum):
    owner = "owner"
    analyst = "analyst"
    admin = "admin"


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Who the key is for")
    role: Role


class ApiKeyCreated(BaseModel):
    principal_id: str
    key_id: str
    name: str
    role: Role
    key: str = Field(description="The secret; shown once, stored only as a hash")
    created_at: datetime


class Me(BaseModel):
    principal_id: str
    name: str
    role: Role
