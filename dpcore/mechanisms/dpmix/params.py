"""DPMix's parameters: the one definition the API schema, the accountants' keys, the audit
and the worker derive from."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from dpcore.mechanisms.clipping import ClipNormParams
from dpcore.mechanisms.postprocess import ReleaseOnlyParams


class DPMixParams(ReleaseOnlyParams, ClipNormParams):
    model_config = ConfigDict(extra="forbid")

    mixture_degree: int = Field(ge=1, description="ℓ: distinct records averaged per mixture")
    n_samples: int = Field(ge=1, description="T: number of mixtures released")
    assignment: Literal["mixture", "record"] = Field(
        default="mixture",
        description="mixture: every mixture draws ℓ distinct records (Thm 1); record: every "
        "record joins ⌈Tℓ/n⌉ distinct mixtures (Appendix B, Thm 3)",
    )
