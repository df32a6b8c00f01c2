"""The row-norm bound C every row-clipping mechanism takes.

Rows are scaled to [0, 1] by the declared bounds and clipped to L2 norm C
(``dpcore.preprocessing.RowTransform``): records inside C are released exactly (in raw units,
after the mechanism's noise), longer ones are scaled down to C. For the mechanisms whose
accountants assume ‖row‖ ≤ 1 the rows are then divided by C, so their accounting does not
change with C — only the noise in raw units does (σ · C · (hi − lo)). C = 1 is per-row
normalisation: almost every row of a wide dataset is scaled down.

The default depends on the data's kind (public: the declared feature shape), by measurement
(``DEFAULT_RULE``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from dpcore.mechanisms.spec import InvalidParams, PublicFacts, ShapeDefault

CLIP_HELP = (
    "C: every record, scaled to [0, 1] per feature by the declared bounds, is clipped to L2 "
    "norm ≤ C (records inside C are released exactly, longer ones scaled down to C); the "
    "noise in raw units grows with C. C = 1 is per-row normalisation (nearly every row of a "
    "wide dataset scaled down); C = √d clips nothing"
)

# Chosen by measurement (docs/results/clip_norm.md, "Choice"): tables keep most rows exact at
# ⌈√d⌉/2 at little cost against C = 1, while C = √d loses much; on image-shaped data per-row
# normalisation does not measurably help, and ⌈√d⌉/3 keeps about half the rows exact.
DEFAULT_RULE = "⌈√d⌉/3 for image-shaped data, ⌈√d⌉/2 otherwise, at least 1 (measured)"


def is_image(facts: PublicFacts) -> bool:
    return len(facts.feature_shape) >= 2


def default_clip_norm(facts: PublicFacts, image_divisor: float = 3) -> float:
    """``DEFAULT_RULE``; a mechanism whose noise grows faster with C may divide ⌈√d⌉ by more
    on image-shaped data."""
    root = math.ceil(math.sqrt(facts.n_features))
    return max(1.0, root / image_divisor if is_image(facts) else root / 2)


CLIP_DEFAULT = ShapeDefault(
    "clip_norm", DEFAULT_RULE, lambda values, facts: default_clip_norm(facts)
)


class ClipNormParams(BaseModel):
    # 1.0 (per-row normalisation) only where the params model is built directly (tests,
    # accounting); a request through the API, and the benches, get the shape default
    # (``CLIP_DEFAULT``) when they leave it out.
    clip_norm: float = Field(default=1.0, gt=0, allow_inf_nan=False, description=CLIP_HELP)


def check_clip_norm(clip_norm: float, facts: PublicFacts) -> None:
    """Above √d nothing can be clipped (features in [0, 1]): only noise would grow."""
    top = math.sqrt(facts.n_features)
    if clip_norm > top * (1 + 1e-12):
        raise InvalidParams(
            f"clip_norm {clip_norm:g} exceeds √d = {top:.4g}: no record scaled to [0, 1] is "
            "longer, so it would only add noise; use at most √d"
        )


def clip_of(params: Any) -> float:
    value = params["clip_norm"] if isinstance(params, Mapping) else params.clip_norm
    return float(value)
