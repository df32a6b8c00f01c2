"""DPMix's parameters: the one definition the API schema, the accountants' keys, the audit
and the worker derive from."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from dpcore.mechanisms.basis import BasisParams
from dpcore.mechanisms.postprocess import POSTPROCESS_HELP, Postprocess


class DPMixParams(BasisParams):
    model_config = ConfigDict(extra="forbid")

    mixture_degree: int = Field(ge=1, description="ℓ: distinct records averaged per mixture")
    n_samples: int = Field(ge=1, description="T: number of mixtures released")
    assignment: Literal["mixture", "record"] = Field(
        default="mixture",
        description="mixture: every mixture draws ℓ distinct records (Thm 1); record: every "
        "record joins ⌈Tℓ/n⌉ distinct mixtures (Appendix B, Thm 3)",
    )
    # Default none, by measurement (docs/results/sweet_spot.md: every model family with and
    # without denoise): the raw rows keep every family usable; denoise is the opt-in.
    postprocess: Postprocess = Field(default="none", description=POSTPROCESS_HELP)
