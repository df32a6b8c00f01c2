"""Release requests and responses. ``params`` names match ``dprelease account`` keys."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ReleaseStatus = Literal["queued", "running", "succeeded", "failed"]
ReleaseFormat = Literal["npz", "csv", "parquet"]


def _finite_positive(value: float | None, name: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0")
    return value


class DPMixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mixture_degree: int = Field(ge=1, description="ℓ: distinct records averaged per mixture")
    n_samples: int = Field(ge=1, description="T: number of mixtures released")
    assignment: Literal["mixture", "record"] = Field(
        default="mixture",
        description="mixture: every mixture draws ℓ distinct records (Thm 1); record: every "
        "record joins ⌈Tℓ/n⌉ distinct mixtures (Appendix B, Thm 3)",
    )


def _null_or_empty() -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


# The model validator below, for clients and for schema-driven tests: declared statistics go
# with (and only with) 'declared', stats_noise with (and only with) 'dp'.
_DPCDA_RULES: dict[str, Any] = {
    "allOf": [
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


class DPCDAParams(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_DPCDA_RULES)

    mixture_degree: int = Field(ge=1, description="ℓ: distinct records of one class per mixture")
    n_samples: int = Field(ge=1, description="T: mixtures in all, split evenly over classes")
    clip_norm: float = Field(default=1.0, gt=0, description="C: L2 clip of every record")
    min_class_size: int = Field(
        ge=1,
        description="m: a public lower bound on every class's size, declared by the owner "
        "(checked against the data; the accountant's sampling ratio is ℓ/m)",
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
        return self


class LocalPerturbationParams(BaseModel):
    """Every record released once with Gaussian noise; nothing to choose."""

    model_config = ConfigDict(extra="forbid")


class RandomProjectionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    projection_dim: int = Field(ge=1, description="d: dimension of the projected features")
    spectral_norm: float = Field(
        default=1.0, gt=0, description="s: the projection is rescaled to this spectral norm"
    )


class SGDRMParams(BaseModel):
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


NoiseSamplerName = Literal["secure", "fast"]


class NoiseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sigma_x: float = Field(gt=0, description="Std of the Gaussian noise on (preprocessed) features")
    sigma_y: float | None = Field(
        default=None, gt=0, description="Label noise std (default: sigma_x)"
    )

    @field_validator("sigma_x", "sigma_y")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        return _finite_positive(value, "noise")


# The model validator below, in the schema: exactly one of epsilon and noise; noise_ratio only
# with epsilon.
_EPSILON_XOR_NOISE: dict[str, Any] = {
    "oneOf": [
        {"required": ["epsilon"], "properties": {"epsilon": {"type": "number"}}},
        {"required": ["noise"], "properties": {"noise": {"type": "object"}}},
    ],
    "not": {
        "required": ["noise", "noise_ratio"],
        "properties": {"noise": {"type": "object"}, "noise_ratio": {"type": "number"}},
    },
}


class _ReleaseCommon(BaseModel):
    """Give either ``epsilon`` (the noise is calibrated) or ``noise`` (its ε is reported)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_EPSILON_XOR_NOISE)

    dataset_id: str
    epsilon: float | None = Field(default=None, gt=0, description="Target ε; calibration meets it")
    delta: float | None = Field(
        default=None, gt=0, lt=1, description="δ of this release (default: the budget's δ)"
    )
    noise: NoiseIn | None = None
    noise_ratio: float | None = Field(
        default=None, gt=0, description="σ_y/σ_x when calibrating (default 1)"
    )
    accountant: Literal["paper", "tight"] = Field(
        default="tight",
        description="tight: dprelease's tightest valid analysis; paper: the paper's theorem",
    )
    noise_sampler: NoiseSamplerName = Field(
        default="secure",
        description="secure: values on a power-of-two lattice plus exact rounded-Gaussian "
        "noise from the OS CSPRNG (hardened against floating-point attacks; σ raised by the "
        "rounding slack, at most a few per mille, so the charge is unchanged); fast: float "
        "noise from torch's generator, not hardened (docs/privacy.md, 'Hardened noise')",
    )
    format: ReleaseFormat = "npz"
    report_test_dataset_id: str | None = Field(
        default=None,
        description="Another dataset of yours with the same features and classes: the job "
        "then attaches a utility report computed on that raw data, visible to you only "
        "(GET /releases/{id}/report)",
    )

    @field_validator("epsilon", "noise_ratio")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        return _finite_positive(value, "epsilon and noise_ratio")

    @model_validator(mode="after")
    def _epsilon_xor_noise(self) -> _ReleaseCommon:
        if (self.epsilon is None) == (self.noise is None):
            raise ValueError("give exactly one of 'epsilon' (calibrate) or 'noise' (report ε)")
        if self.noise is not None and self.noise_ratio is not None:
            raise ValueError("'noise_ratio' applies to calibration; with 'noise' set sigma_y")
        return self


class DPMixRequest(_ReleaseCommon):
    mechanism: Literal["dpmix"]
    params: DPMixParams


class LocalPerturbationRequest(_ReleaseCommon):
    mechanism: Literal["local_perturbation"]
    params: LocalPerturbationParams = Field(default_factory=LocalPerturbationParams)


class RandomProjectionRequest(_ReleaseCommon):
    mechanism: Literal["random_projection"]
    params: RandomProjectionParams


class DPCDARequest(_ReleaseCommon):
    mechanism: Literal["dpcda"]
    params: DPCDAParams


class SGDRMRequest(_ReleaseCommon):
    mechanism: Literal["sgdrm"]
    params: SGDRMParams


AnyReleaseRequest = (
    DPMixRequest | DPCDARequest | SGDRMRequest | LocalPerturbationRequest | RandomProjectionRequest
)
ReleaseRequest = Annotated[AnyReleaseRequest, Field(discriminator="mechanism")]


class Noise(BaseModel):
    sigma_x: float = Field(description="Feature noise std the accountant was given")
    sigma_y: float = Field(description="Label noise std the accountant was given")
    sampler: NoiseSamplerName = Field(description="How the noise is drawn (see the request)")


class Charge(BaseModel):
    epsilon: float = Field(description="ε this release costs at its δ (a valid upper bound)")
    delta: float


class Artifact(BaseModel):
    format: ReleaseFormat
    bytes: int
    sha256: str


class Timings(BaseModel):
    queued_seconds: float | None = None
    run_seconds: float | None = None


class ReleaseOut(BaseModel):
    id: str
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    accountant: str
    format: ReleaseFormat
    status: ReleaseStatus
    progress: float = Field(ge=0, le=1)
    noise: Noise
    charge: Charge
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    timings: Timings
    artifact: Artifact | None
    report: str | None = Field(
        default=None, description="Path of the owner-only utility report, when requested"
    )


class ReleaseList(BaseModel):
    items: list[ReleaseOut]


class ReleaseQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt filter must not list everything

    dataset_id: str | None = Field(default=None, description="Only this dataset's releases")


class BudgetPreview(BaseModel):
    epsilon: float
    delta: float
    spent: float
    reserved: float
    remaining: float
    total_after: float | None = Field(
        description="Composed spend if this release were admitted (null: no valid bound fits)"
    )
    remaining_after: float
    admissible: bool


class PreviewOut(BaseModel):
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    accountant: str
    noise: Noise
    charge: Charge
    budget: BudgetPreview


class AccountantInfo(BaseModel):
    name: str
    summary: str
    valid_bound: bool = Field(description="False: reproduces a paper, refused for releases")
    caveat: str | None = None


class MechanismInfo(BaseModel):
    name: str
    summary: str
    output: str = Field(description="What a release of this mechanism holds")
    params_schema: dict[str, Any] = Field(description="JSON schema of `params`")
    accountants: list[AccountantInfo]


class MechanismList(BaseModel):
    items: list[MechanismInfo]
