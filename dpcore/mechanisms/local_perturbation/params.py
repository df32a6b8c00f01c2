"""Local perturbation's parameters: none (every record is released once)."""

from __future__ import annotations

from pydantic import ConfigDict

from dpcore.mechanisms.clipping import ClipNormParams


class LocalPerturbationParams(ClipNormParams):
    """Every record released once with Gaussian noise; only the row-norm bound to choose."""

    model_config = ConfigDict(extra="forbid")
