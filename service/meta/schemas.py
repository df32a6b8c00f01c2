from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class ReadinessCheck(BaseModel):
    ok: bool
    seconds: float = Field(description="How long the check took")
    error: str | None = Field(
        default=None,
        description="The failure's kind (an exception type or Timeout); details are logged",
    )


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    checks: dict[str, ReadinessCheck] = Field(description="database, broker and store")
