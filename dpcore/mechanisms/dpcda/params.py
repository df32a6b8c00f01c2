"""DP-CDA's parameters: the one definition the API schema, the accountants' keys, the audit
and the worker derive from."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dpcore.mechanisms.basis import BASIS_RULE
from dpcore.mechanisms.clipping import CLIP_HELP
from dpcore.mechanisms.postprocess import ReleaseOnlyParams


def _null_or_empty() -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


# The model validator below, for clients and for schema-driven tests: declared statistics go
# with (and only with) 'declared', stats_noise with (and only with) 'dp'.
_DPCDA_RULES: dict[str, Any] = {
    "allOf": [
        BASIS_RULE,
        {
            "if": {
                "properties": {"standardization": {"const": "declared"}},
                "required": ["standardization"],
            },
            "then": {
                "required": ["feature_mean", "feature_std"],
                "properties": {"feature_mean": {"type": "array"}, "feature_std": {"type": "array"}},
            },
            "else": {
                "properties": {"feature_mean": _null_or_empty(), "feature_std": _null_or_empty()}
            },
        },
        {
            "if": {
                "properties": {"class_sizes": {"const": "dp"}},
                "required": ["class_sizes"],
            },
            "then": {
                "required": ["count_noise"],
                "properties": {"count_noise": {"type": "number"}},
            },
            "else": {"properties": {"count_noise": {"type": "null"}}},
        },
        {
            "if": {
                "properties": {"standardization": {"const": "dp"}},
                "required": ["standardization"],
            },
            "then": {
                "required": ["stats_noise"],
                "properties": {"stats_noise": {"type": "number"}},
            },
            "else": {"properties": {"stats_noise": {"type": "null"}}},
        },
    ]
}


class DPCDAParams(ReleaseOnlyParams):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_DPCDA_RULES)

    mixture_degree: int = Field(ge=1, description="ℓ: distinct records of one class per mixture")
    n_samples: int = Field(ge=1, description="T: mixtures in all, split evenly over classes")
    clip_norm: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description=f"{CLIP_HELP}. With standardization declared or dp, C bounds the "
        "z-scored record instead",
    )
    min_class_size: int = Field(
        ge=1,
        description="m: a public lower bound on every class's size, declared by the owner; "
        "the accountant's sampling ratio is ℓ/m. With class_sizes 'declared' it is checked "
        "against the private counts and the guarantee covers only datasets whose classes all "
        "have ≥ m records; with 'dp' the job checks it against DP lower bounds instead",
    )
    class_sizes: Literal["declared", "dp"] = Field(
        default="declared",
        description="declared: min_class_size is assumed of both neighbours (a restriction "
        "of the neighbour relation) and checked against the private counts; dp: noisy "
        "per-class counts (noise count_noise, charged) give lower bounds that hold with "
        "probability ≥ 1 − class_size_failure_prob (added to δ); if one falls below "
        "min_class_size the mixtures are replaced by noise alone. Valid for all datasets",
    )
    count_noise: float | None = Field(
        default=None,
        gt=0,
        description="dp class sizes: noise std on each class count (replace-one moves two "
        "counts by 1: μ = √2/count_noise)",
    )
    class_size_failure_prob: float = Field(
        default=1e-9,
        gt=0,
        le=1e-3,
        description="dp class sizes: probability that some DP lower bound exceeds its class "
        "size (added to δ, with a factor 1 + e^ε)",
    )
    standardization: Literal["unit_range", "declared", "dp"] = Field(
        default="unit_range",
        description="unit_range: scale by the declared feature_range to [0, 1]; declared: "
        "z-score with the owner's public feature_mean/feature_std; dp: z-score with means and "
        "stds estimated under DP (noise stats_noise), charged with the release",
    )
    stats_noise: float | None = Field(
        default=None,
        gt=0,
        description="dp: noise std on the per-feature sums and sums of squares of the "
        "[0, 1]-scaled features (μ = √(2d)/stats_noise)",
    )
    feature_mean: list[float] | None = Field(default=None, description="Public, per feature")
    feature_std: list[Annotated[float, Field(gt=0)]] | None = Field(
        default=None, description="Public, per feature"
    )

    @model_validator(mode="after")
    def _declared_stats(self) -> DPCDAParams:
        given = self.feature_mean is not None and self.feature_std is not None
        if self.standardization == "declared" and not given:
            raise ValueError("standardization 'declared' needs feature_mean and feature_std")
        if self.standardization != "declared" and (self.feature_mean or self.feature_std):
            raise ValueError("feature_mean/feature_std apply to standardization 'declared'")
        if self.feature_std is not None and any(s <= 0 or s != s for s in self.feature_std):
            raise ValueError("feature_std must be positive numbers")
        if (self.standardization == "dp") != (self.stats_noise is not None):
            raise ValueError("stats_noise goes with standardization 'dp' (and is required there)")
        if (self.class_sizes == "dp") != (self.count_noise is not None):
            raise ValueError("count_noise goes with class_sizes 'dp' (and is required there)")
        return self
