"""Random projection's parameters: the one definition the API schema, the accountants' keys,
the audit and the worker derive from."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from dpcore.mechanisms.clipping import ClipNormParams


class RandomProjectionParams(ClipNormParams):
    model_config = ConfigDict(extra="forbid")

    projection_dim: int = Field(ge=1, description="d: dimension of the projected features")
    spectral_norm: float = Field(
        default=1.0, gt=0, description="s: the projection is rescaled to this spectral norm"
    )
