"""Release requests and responses. ``params`` names match ``dprelease account`` keys."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.releases.status import ReleaseStatus
from service.strict_json import StrictBody

ReleaseFormat = Literal["npz", "csv", "parquet"]


def _finite_positive(value: float | None, name: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0")
    return value


NoiseSamplerName = Literal["secure", "fast"]


# Strict types (StrictBody): a number field takes a JSON number only (an integer where a
# float is asked for), never a bool or a string ("epsilon": true was 1, "1" was 1.0); a bool
# field takes true or false only. The schema already says so ("type": "number").
class NoiseIn(StrictBody):
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


# Past ε ≈ 1e3 a release protects nothing an analyst could measure, and the accountants'
# curves reach their numerical ends (ε infinite below a noise floor): calibrating towards a
# target of 1e300 spends minutes on that edge. Larger targets are refused, not searched.
MAX_TARGET_EPSILON = 1000.0


class _ReleaseCommon(StrictBody):
    """Give either ``epsilon`` (the noise is calibrated) or ``noise`` (its ε is reported)."""

    model_config = ConfigDict(json_schema_extra=_EPSILON_XOR_NOISE)

    dataset_id: str
    epsilon: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TARGET_EPSILON,
        description="Target ε; calibration meets it",
    )
    delta: float | None = Field(
        default=None, gt=0, lt=1, description="δ of this release (default: the budget's δ)"
    )
    noise: NoiseIn | None = None
    noise_ratio: float | None = Field(
        default=None, gt=0, description="σ_y/σ_x when calibrating (default 1)"
    )
    noise_sampler: NoiseSamplerName = Field(
        default="secure",
        description="secure: values on a power-of-two lattice plus exact rounded-Gaussian "
        "noise from the OS CSPRNG (hardened against floating-point attacks; σ raised by the "
        "rounding slack, at most 1/64 plus the floating-point cover — 0.03–1.4 % at the "
        "MNIST-10k defaults — so the charge is unchanged); fast: float "
        "noise from torch's generator, not hardened (docs/privacy.md, 'Hardened noise')",
    )
    format: ReleaseFormat = "npz"
    report_test_dataset_id: str | None = Field(
        default=None,
        description="Another dataset of yours with the same features and classes: the job "
        "then attaches a utility report computed on that raw data, visible to you only "
        "(GET /releases/{id}/report)",
    )
    research: bool = Field(
        default=False,
        description="Opt in to a research release, required by (and only by) an accountant "
        "whose ε is NOT a valid bound (a paper's own analysis, e.g. clustmix variant paper): "
        "the release is shown to you, the dataset's owner, only — never to analysts (grants "
        "do not reach it) nor admins — cannot be downloaded by anyone else, and charges "
        "nothing to the budget; the accountant's ε is reported as a claim, not a guarantee",
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


class ReleaseRequestBase(_ReleaseCommon):
    """What every release request holds. Each served mechanism's request (built from the
    registry by ``service.releases.mechanisms``) narrows ``mechanism`` to its name, ``params``
    to its parameter model and ``accountant`` to its accountants' names."""

    mechanism: str
    params: BaseModel
    accountant: str = "tight"


class NoiseScaleOut(BaseModel):
    name: str
    sigma: float = Field(description="Std of the Gaussian noise on each entry")
    sensitivity: float = Field(
        description="L2 distance one replaced record moves a noised row, as the accountant "
        "assumed (the secure sampler's lattice is planned from it)"
    )
    perturbs: list[str] = Field(description="What this noise is added to")
    description: str = ""
    at_least: bool = Field(False, description="std picked as the release runs, never below sigma")


class Noise(BaseModel):
    """Every Gaussian noise of the release, as its accountant described it."""

    sigma_x: float = Field(
        description="σ of the calibrated scale (what a request's noise.sigma_x sets)"
    )
    sigma_y: float | None = Field(
        description="σ of the noise on labels; null when labels are not noised"
    )
    sampler: NoiseSamplerName = Field(description="How the noise is drawn (see the request)")
    calibrated: str = Field(description="Name of the scale calibration searched")
    scales: list[NoiseScaleOut]
    analysis: dict[str, float] = Field(
        default_factory=dict,
        description="Parameters the accountant fixed that the mechanism uses too",
    )


class ResearchOut(BaseModel):
    """What a research release's accountant claims, and why that is not a guarantee."""

    statement: str = Field(description="In words: what this release is and is not")
    claimed_epsilon: float = Field(
        description="The accountant's ε at claimed_delta: the paper's number, NOT a bound"
    )
    claimed_delta: float
    caveat: str = Field(description="What the accountant's analysis leaves out")


class Charge(BaseModel):
    epsilon: float = Field(
        description="ε this release costs at its δ (a valid upper bound; 0 for a research "
        "release, which charges nothing)"
    )
    delta: float
    charged_as: str | None = Field(
        default=None,
        description="How the ledger's filter charged it (basic: its (ε, δ) add up; renyi: "
        "its RDP curve composes); null in a preview before admission decides",
    )
    consumed_epsilon: float | None = Field(
        default=None, description="What it added to the dataset's spent ε under the filter"
    )
    consumed_delta: float | None = Field(
        default=None, description="What it added to the dataset's spent δ under the filter"
    )


class Settlement(BaseModel):
    """What became of a release's charge: its ledger entry's state, and the rule behind it."""

    state: str = Field(
        description="reserved while it is queued or running; committed (the charge stands) or "
        "refunded once it ended"
    )
    because: str | None = Field(
        default=None,
        description="Why it was committed or refunded: succeeded; upload_claimed (it ended "
        "otherwise, but output may exist); private_data_read (it failed or was cancelled after "
        "its job had begun reading the dataset's content: the charge stands, docs/privacy.md "
        "'Failures and cancellations'); before_private_read (refunded: it ended before any "
        "read); null while reserved, or for a release settled before this was recorded",
    )


class Artifact(BaseModel):
    format: ReleaseFormat
    bytes: int
    sha256: str


class ExtraArtifactOut(BaseModel):
    """A further file of a succeeded release (a model's weights, say)."""

    name: str
    media_type: str
    description: str
    bytes: int
    sha256: str
    download: str = Field(description="Its path: GET /releases/{id}/artifacts/{name}")


class Timings(BaseModel):
    """How long the job waited and ran: the dataset's owner only (a job's run time is a
    timing of a computation on private data); null for everyone else."""

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
    progress: float = Field(
        ge=0, le=1, description="Fraction done (the job's own units where it reports them)"
    )
    phase: str | None = Field(
        default=None,
        description="What the job last reported it was doing: 'rows' while it writes rows, "
        "or the mechanism's word for its step (training epochs, say); null until it reports",
    )
    noise: Noise
    charge: Charge
    settlement: Settlement | None = Field(
        default=None,
        description="What became of the charge (reserved, committed or refunded, and why); "
        "null for a research release, which charges nothing",
    )
    if_cancelled: Literal["refunded", "committed"] | None = Field(
        default=None,
        description="Queued or running, to the dataset's owner (who alone may cancel): what a "
        "cancel landing now would do with the charge. refunded: no job has begun reading the "
        "dataset; committed: one has (or claimed the upload), and the full ε stays charged "
        "whatever the progress, a sharded release's too. A job may begin reading before the "
        "cancel lands: its answer's settlement says what was done. Null otherwise",
    )
    neighbour_relation: str = Field(
        description="The neighbour relation its ε holds for: 'replace-one (n public)', or a "
        "narrower one its parameters opted in to (dpcda's class_sizes 'declared': "
        "replace-one over datasets whose every class has ≥ min_class_size records)"
    )
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None = Field(
        description="When its job first started: the dataset's owner only (null for others)"
    )
    finished_at: datetime | None = Field(
        description="When it ended: the dataset's owner only (null for others)"
    )
    timings: Timings = Field(description="Queue and run time: the dataset's owner only")
    artifact: Artifact | None
    artifacts: list[ExtraArtifactOut] = Field(
        default_factory=list,
        description="Further files the mechanism released beside the artifact, once succeeded",
    )
    report: str | None = Field(
        default=None, description="Path of the owner-only utility report, when requested"
    )
    research: ResearchOut | None = Field(
        default=None,
        description="Set for a research release (owner-only, charged nothing): its "
        "accountant's ε is not a bound",
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
    delta_spent: float
    delta_reserved: float
    delta_remaining: float
    total_after: float | None = Field(
        description="The filter's spent ε if this release were admitted (null: none fits)"
    )
    remaining_after: float
    delta_after: float = Field(description="The filter's spent δ if it were admitted")
    delta_remaining_after: float
    charged_as: str = Field(
        description="How the filter would charge it: basic or renyi (docs/privacy.md)"
    )
    admissible: bool


class PreviewWarning(BaseModel):
    code: Literal[
        "delta_exhausted",
        "delta_low",
        "shape_undeclared",
        "classes_may_not_mix",
        "bins_lost_in_noise",
        "mostly_noise",
    ] = Field(
        description="delta_exhausted: admitting it would leave no δ while ε remains (later "
        "releases without an RDP curve are then refused); delta_low: the δ left would be "
        "small for the ε left (later releases get a small default δ, so more noise); "
        "shape_undeclared: flat numeric rows whose count of features is a square (784 = 28²) "
        "get table defaults — if they are images, upload them with feature_shape; "
        "classes_may_not_mix: DP-CDA with DP class sizes mixes only if every class holds "
        "min_class_size plus the DP bounds' margin, likely not met here (the release is then "
        "noise alone, charged); bins_lost_in_noise: MST's or AIM's numeric bins hold too few "
        "rows each for the first measurements' noise (fewer bins keep more of a column's shape); "
        "mostly_noise: the noise on some columns' released values has a std larger than the "
        "column's declared range, so those values are mostly noise at this ε"
    )
    message: str


class ColumnNoise(BaseModel):
    column: str = Field(description="The feature column (NPZ: its flat index)")
    range: tuple[float, float] = Field(description="Its declared feature_range [lo, hi]")
    noise_std_raw: float = Field(
        description="Std of the noise on this column's released values, in the column's raw "
        "units: the unit-scale noise std × (hi − lo), for a record the row-norm bound did not "
        "scale down (one scaled down by s carries s times this, at most max_row_shrink times)"
    )
    noise_to_range: float = Field(description="noise_std_raw / (hi − lo)")


class NoiseSpread(BaseModel):
    min: float
    median: float
    max: float


class NoiseGuide(BaseModel):
    """How loud the release's noise is against each column's declared range (public figures
    only: σ, the declared bounds, shape and basis)."""

    applies: bool = Field(
        description="False where the released values carry no per-value noise that public "
        "figures fix (meaning says why); the other figures are then null"
    )
    meaning: str = Field(description="What a released value is and what the figures mean")
    max_row_shrink: float | None = Field(
        description="The most the preprocessing's row-norm bound scales a record down (√d / "
        "the bound): the figures hold for rows it leaves unscaled, and are up to this many "
        "times larger, relative to a record's raw values, for rows it scales"
    )
    noise_to_range: NoiseSpread | None = Field(
        description="noise_to_range over every feature column"
    )
    noise_std_raw: NoiseSpread | None = Field(description="noise_std_raw over every feature column")
    columns: list[ColumnNoise] | None = Field(
        description="Per feature column, for datasets of at most DPRELEASE_PREVIEW_NOISE_COLUMNS "
        "features; null for wider ones (the spreads above summarise them)"
    )
    mostly_noise: list[str] | None = Field(
        default=None,
        description="The feature columns whose noise std is at least their declared range "
        "(noise_to_range ≥ 1): values there are mostly noise (at most 10 named)",
    )
    mostly_noise_count: int = Field(
        default=0, description="How many feature columns mostly_noise would list in all"
    )


class MeasuredOn(BaseModel):
    """The public dataset and budget a recommendation was measured on, and what it scored."""

    dataset: str = Field(description="The public dataset of the study (docs/results/)")
    n: int = Field(description="Its private rows in the study")
    d: int = Field(description="Its features")
    classes: int
    image: bool = Field(description="Whether it was uploaded image-shaped")
    epsilon: float
    delta: float
    metric: Literal["balanced_accuracy", "accuracy"] = Field(
        description="The figure configurations were ranked by: its mean over `models`"
    )
    models: list[str] = Field(description="The models trained on the release and averaged")
    score: float = Field(description="Mean over models (and repeats) of the metric")
    spread: float = Field(description="max − min of the per-run score over the repeats")
    repeats: int
    candidates: int = Field(description="How many configurations of the mechanism competed")
    metrics: dict[str, float] = Field(
        description="Each model's mean of every measured metric, `<model>_<metric>`"
    )
    source: str = Field(description="The study's CSV in the repository")


class Recommendation(BaseModel):
    """A configuration for this dataset's public shape, from the project's
    measured table (dpcore/mechanisms/recommendations.json). Only public facts are read: n,
    the declared features, classes and feature shape, the request's ε and the server's caps —
    never the class counts."""

    mechanism: str
    kind: Literal["mechanism", "baseline"] = Field(
        description="baseline: a comparison point, not a recommended choice (GET /mechanisms)"
    )
    params: dict[str, Any] = Field(
        description="The params to send: admissible on this dataset's public shape (request "
        "model, shape defaults and admission checks passed; with dpcda's class_sizes "
        "'declared' min_class_size is still checked against the class counts at admission)"
    )
    resolved_params: dict[str, Any] = Field(
        description="`params` with every shape default filled in, as admission stores them"
    )
    measured_on: MeasuredOn | None = Field(
        description="The nearest measured entry; null: the mechanism is not in the table "
        "and its defaults are given"
    )
    distance: float | None = Field(
        description="|ln ε/ε'| + |ln n/n'| + |ln d/d'|/2 + |ln c/c'|/2 to the measured entry"
    )
    same_kind: bool = Field(
        description="Whether the measured dataset is of this dataset's kind (image or table)"
    )
    why: str = Field(description="One line: what was measured and what was adapted")


class PreviewOut(BaseModel):
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    accountant: str
    noise: Noise
    charge: Charge
    neighbour_relation: str = Field(
        description="The neighbour relation its ε holds for: 'replace-one (n public)', or a "
        "narrower one its parameters opted in to (dpcda's class_sizes 'declared': "
        "replace-one over datasets whose every class has ≥ min_class_size records)"
    )
    budget: BudgetPreview
    warnings: list[PreviewWarning] = Field(
        default_factory=list,
        description="What admitting this release would do to the budget's δ (public ledger "
        "figures only); empty when nothing is wrong",
    )
    research: ResearchOut | None = Field(
        default=None, description="Set when the request is a research release"
    )
    noise_guide: NoiseGuide = Field(
        description="The noise in the columns' raw units: its std against each column's "
        "declared range"
    )
    recommended: list[Recommendation] = Field(
        default_factory=list,
        description="Per mechanism the service runs (baselines marked), the configuration "
        "measured best on the public dataset nearest to this one's public shape at this ε; a "
        "mechanism none of whose configurations (measured, shape defaults, all defaults) "
        "passes this dataset's admission checks is left out",
    )


class AccountantInfo(BaseModel):
    name: str
    summary: str
    valid_bound: bool = Field(
        description="False: reproduces a paper; releases only as research releases "
        "(request field `research`)"
    )
    caveat: str | None = None
    releases: bool = Field(
        description="False: analyses an algorithm the service does not run (offline only)"
    )


class MechanismInfo(BaseModel):
    name: str
    summary: str
    kind: Literal["mechanism", "baseline"] = Field(
        description="baseline: a comparison point published to measure the mechanisms "
        "against (it gives chance-level models at practical ε), not a recommended choice"
    )
    good_for: str = Field(description="What data and uses it suits, from the measured results")
    reference: str = Field(description="The paper it implements")
    output: str = Field(description="What a release of this mechanism holds")
    label_kind: Literal["exact", "proportions", "combinations"] = Field(
        description="What a released row's label is, which names a release table's label "
        "column(s): exact — one column named as the dataset's label column, holding the "
        "class; proportions — '<label>=<class>' columns holding class proportions; "
        "combinations — '<label>=<class>' columns holding signed values as drawn"
    )
    params_schema: dict[str, Any] = Field(description="JSON schema of `params`")
    essential_params: list[str] = Field(
        default_factory=list,
        description="The few parameters an owner is likely to set (the console shows them "
        "first and the rest under 'Advanced'); every parameter has a default",
    )
    accountants: list[AccountantInfo]
    shardable: str | None = Field(
        default=None,
        description="When a large release of this mechanism is drawn as independent shards "
        "on several workers (more rows than the server's DPRELEASE_SHARD_ROWS; same law, "
        "same charge, one file): the parameter counting its rows and the exceptions; null: "
        "it always runs whole",
    )


class MechanismList(BaseModel):
    items: list[MechanismInfo]


# GET /releases/{id}/summary: post-processing of the release file (service/releases/summary.py).
class SummaryValueRange(BaseModel):
    """The owner's declared bounds per feature (public), for a release in the data's units."""

    lo: list[float]
    hi: list[float]


class SummarySample(BaseModel):
    row: int = Field(description="The row's index in the file (0-based)")
    features: list[float] = Field(description="The row's feature values, in feature order")
    label: int | str | list[float] = Field(
        description="An exact label: the row's class; otherwise the label columns' values"
    )


class SummaryHistogram(BaseModel):
    column: str
    kind: Literal["numeric", "categorical"]
    range_source: Literal["declared", "release"] | None = Field(
        default=None,
        description="numeric: bins over the declared bounds (declared; [0, 1] for class "
        "proportions) or over the column's own min–max in the release (release)",
    )
    edges: list[float] | None = Field(default=None, description="numeric: the bins' edges")
    categories: list[str] | None = Field(
        default=None, description="categorical: the classes, in declared order"
    )
    counts: list[int] = Field(description="Rows per bin (or per class)")
    below: int = Field(default=0, description="Values below the declared range")
    above: int = Field(default=0, description="Values above the declared range")
    missing: int = Field(
        default=0,
        description="Rows where the value is missing (a declared table's column whose "
        "missing-value indicator is 1, or a categorical column holding no category); not in "
        "counts",
    )


class ReleaseSummary(BaseModel):
    """A look at a succeeded release's file: what the download serves, post-processed."""

    rows: int
    columns: list[str] = Field(description="The file's columns: features, then label(s)")
    feature_columns: list[str]
    label_columns: list[str]
    label_kind: str | None = Field(description="exact, proportions or combinations")
    classes: list[str]
    feature_shape: list[int] | None = Field(
        description="[h, w] when the rows are images of the declared shape; else null"
    )
    value_range: SummaryValueRange | None = Field(
        description="Declared bounds per feature when the release is in the data's units"
    )
    display_range: list[float] | None = Field(
        description="[lo, hi] to draw sampled values with: the declared bounds' extent, else "
        "the sampled values' own"
    )
    samples: list[SummarySample] = Field(
        description="At most 64 rows spread evenly over the file (row ⌊i·n/k⌋ for i < k = "
        "min(n, 64)): a fixed public rule"
    )
    histograms: list[SummaryHistogram] = Field(
        description="Per column (for image-shaped rows: the label column(s) only)"
    )
