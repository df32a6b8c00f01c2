"""Local perturbation's parameters: none (every record is released once)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class LocalPerturbationParams(BaseModel):
    """Every record released once with Gaussian noise; nothing to choose."""

    model_config = ConfigDict(extra="forbid")
