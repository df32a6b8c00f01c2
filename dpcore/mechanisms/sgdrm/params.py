"""SGDRM's parameters: the one definition the API schema, the accountants' keys, the audit
and the worker derive from."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from dpcore.mechanisms.clipping import ClipNormParams
from dpcore.mechanisms.postprocess import ReleaseOnlyParams


class SGDRMParams(ReleaseOnlyParams, ClipNormParams):
    model_config = ConfigDict(extra="forbid")

    mixture_width: int = Field(ge=1, description="ℓ: each record enters a mixture w.p. ℓ/n")
    n_samples: int = Field(ge=1, description="T: number of mixtures released")
    coefficients: Literal["clipped", "gaussian"] = Field(
        default="clipped",
        description="clipped: coefficients b·clip(g, −c, c); gaussian: the paper's unbounded "
        "b·g, accounted by coupling with the clipped variant (about 2.4× the noise of "
        "clipped at ε = 10; docs/privacy.md)",
    )
    coefficient_bound: float | None = Field(
        default=None,
        gt=0,
        description="c: the clip (clipped; default 3/√mixture_width) or the coupling's "
        "analysis bound (gaussian; default chosen for the target ε, at least 3/√mixture_width)",
    )
