"""DP-CDA's parameters: the one definition the API schema, the accountants' keys, the audit
and the worker derive from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dpcore.mechanisms.basis import BASIS_RULE
from dpcore.mechanisms.clipping import CLIP_HELP
from dpcore.mechanisms.postprocess import ReleaseOnlyParams


def _null_or_empty() -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


# The model validator below, for clients and for schema-driven tests: declared statistics go
# with (and only with) 'declared', stats_noise with (and only with) 'dp', count_noise never
# with class sizes 'declared' (with 'dp', the default, it may be left out: chosen for the
# target at admission, ``count_noise_for_target``).
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
                "properties": {"class_sizes": {"const": "declared"}},
                "required": ["class_sizes"],
            },
            "then": {"properties": {"count_noise": {"type": "null"}}},
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


#: β of the default count_noise's margin (a reference: a release's own β may be smaller).
REFERENCE_FAILURE_PROB = 1e-9


def default_count_noise(min_class_size: int, n_classes: int) -> float:
    """count_noise when a 'dp' request gives none (public figures only): m / (4·z) with
    z = Φ⁻¹(1 − 10⁻⁹/K), so the DP lower bounds sit about m/4 below the noisy counts and a
    class of ≥ 1.25·m records (plus a few count_noise) mixes. Cheap where m is large
    (μ = √2/σ_c: 0.07 at m = 500, K = 10), costly where m is small: at a target, the default
    is the larger of this and the target's own rule (``count_noise_for_target``); this rule
    alone applies to a release at a given σ (no target)."""
    z = -NormalDist().inv_cdf(REFERENCE_FAILURE_PROB / max(1, n_classes))
    return min_class_size / (4.0 * z)


#: The share of the target's μ² that a default count_noise lets the noisy counts take (see
#: ``count_noise_for_target``).
COUNTS_MU2_SHARE = 0.1


def count_noise_for_target(
    min_class_size: int,
    n_classes: int,
    epsilon: float,
    delta: float,
    other_mu2: float = 0.0,
) -> float:
    """count_noise when a 'dp' request at a target (ε, δ) gives none: the larger of the public
    rule (``default_count_noise``) and √2/√(s·(μ² − other_mu2)), s = ``COUNTS_MU2_SHARE``, μ
    the GDP μ whose (ε, δ) is the target (``gdp.mu_for_epsilon``) and ``other_mu2`` the μ² of
    the other Gaussian steps before the mixing (DP statistics). The counts are then μ_c-GDP
    with μ_c² ≤ s·(μ² − other_mu2): they alone never reach the target, whatever m, and leave
    the mixing at least (1 − s) of the μ² budget in GDP terms (μ² adds under composition).

    Why s = 0.1 (a trade-off, not an optimum): a larger share leaves the mixing less (its
    noise grows), a smaller one widens the margin σ_c·Φ⁻¹(1 − β/K) by which the DP lower
    bounds sit below the counts (∝ 1/√s), so that fewer datasets reach min_class_size and mix
    (the others get the noise-only release, ``mixed: false``). At 10 % the counts take a tenth
    of the μ² budget and the mixing keeps ≥ 90 % of it (≥ 0.95 of μ). Where the public rule
    is already cheaper (large m or large ε) it is kept. Public figures and the target only
    (no private count)."""
    from dpcore.accounting.gdp import mu_for_epsilon

    floor = default_count_noise(min_class_size, n_classes)
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        return floor  # no target to share: calibration refuses it with its own reason
    mu = mu_for_epsilon(epsilon, delta)
    room = mu * mu - other_mu2
    if not room > 0:
        # The other steps alone exceed the target: ``accounting.prepare`` refuses it.
        return floor
    # √2: the counts' L2 sensitivity under replace-one (``accounting_counts``).
    return max(floor, math.sqrt(2.0) / math.sqrt(COUNTS_MU2_SHARE * room))


#: How ``count_noise_for_target`` and ``default_count_noise`` read, for the schema's
#: description.
COUNT_NOISE_RULE = (
    "class_sizes dp: chosen at admission for the target (ε, δ), the larger of "
    "min_class_size / (4·Φ⁻¹(1 − 10⁻⁹ / classes)) (the DP lower bounds then sit about a quarter "
    "of min_class_size below the noisy counts) and the noise at which the counts take at most "
    f"{COUNTS_MU2_SHARE:.0%} of the target's μ² (μ: the Gaussian-DP μ whose (ε, δ) is the "
    "target; with standardization dp, of what the statistics' μ² leaves of it), so the counts "
    "alone never use the target up; stored with the release's parameters. A release at a "
    "given noise takes the first rule alone. null with declared"
)


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
        description="m: a public floor on every class's size, chosen by the owner without "
        "looking at the class counts; the accountant's sampling ratio is ℓ/m. With "
        "class_sizes 'dp' (the default) the job mixes only when every DP lower bound on a "
        "class's size reaches m (else it releases rows of noise alone); with 'declared' it is "
        "checked against the private counts and the guarantee covers only datasets whose "
        "classes all have ≥ m records",
    )
    class_sizes: Literal["declared", "dp"] = Field(
        default="dp",
        description="dp (the default; valid for every pair of replace-one neighbours): noisy "
        "per-class counts (noise count_noise, charged) give lower bounds that hold with "
        "probability ≥ 1 − class_size_failure_prob (added to δ); if one falls below "
        "min_class_size the mixtures are replaced by noise alone; the noisy counts and bounds "
        "are published in the release metadata. declared (opt-in): min_class_size is assumed "
        "of both neighbours and checked against the private counts — a narrower neighbour "
        "relation (replace-one over datasets whose every class has ≥ min_class_size records), "
        "stated on the release, its metadata and its ledger entry",
    )
    count_noise: float | None = Field(
        default=None,
        gt=0,
        description="dp class sizes: noise std on each class count (replace-one moves two "
        "counts by 1: μ = √2/count_noise); null with 'declared'. Default: " + COUNT_NOISE_RULE,
    )
    class_size_failure_prob: float | None = Field(
        default=None,
        gt=0,
        le=1e-3,
        description="dp class sizes: β, the probability that some DP lower bound exceeds its "
        "class size (added to δ, with a factor 1 + e^ε). Default: chosen for the target at "
        "admission, min(1e-9, 10⁻³·δ/(1 + e^ε)) so that it takes at most about a thousandth "
        "of δ at any ε; 1e-9 for a release at a given noise",
    )
    standardization: Literal["unit_range", "declared", "dp"] = Field(
        default="unit_range",
        description="unit_range: scale by the declared feature_range to [0, 1]; declared: "
        "z-score with the owner's feature_mean/feature_std (public: published verbatim, so "
        "never computed from this dataset); dp: z-score with means and "
        "stds estimated under DP (noise stats_noise), charged with the release",
    )
    stats_noise: float | None = Field(
        default=None,
        gt=0,
        description="dp: noise std on the per-feature sums and sums of squares of the "
        "[0, 1]-scaled features (μ = √(2d)/stats_noise)",
    )
    feature_mean: list[float] | None = Field(
        default=None,
        description="standardization declared: the per-feature means, declared public and "
        "published verbatim in the release's parameters and metadata. Computed from this "
        "dataset they are an uncharged statistic of it: give values from public knowledge or "
        "another dataset, or use standardization 'dp'",
    )
    feature_std: list[Annotated[float, Field(gt=0)]] | None = Field(
        default=None,
        description="standardization declared: the per-feature standard deviations, "
        "declared public and published verbatim in the release's parameters and metadata. "
        "Computed from this dataset they are an uncharged statistic of it: give values from "
        "public knowledge or another dataset, or use standardization 'dp'",
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
        if self.class_sizes == "declared" and self.count_noise is not None:
            raise ValueError("count_noise goes with class_sizes 'dp' only")
        return self


def default_failure_prob(epsilon: float, delta: float) -> float:
    """β when a 'dp' request gives none, for its target (ε, δ): (1 + e^ε)·β, the δ it takes,
    stays at most a thousandth of δ (with 1e-9 fixed, ε could not pass ln(δ/(2β)): 8.5 at
    δ = 1e-5)."""
    return min(REFERENCE_FAILURE_PROB, 1e-3 * delta / (1.0 + math.exp(min(epsilon, 700.0))))


def neighbour_relation(params: Mapping[str, Any]) -> str | None:
    """The narrower relation of class sizes 'declared' (None: replace-one). Stored parameters
    without ``class_sizes`` predate 'dp' and were declared."""
    if params.get("class_sizes", "declared") != "declared":
        return None
    return (
        "replace-one (n public) over datasets whose every class has at least "
        f"{params.get('min_class_size')} records (class_sizes 'declared': min_class_size "
        "assumed of both neighbours and checked against the private counts); a neighbour "
        "with a smaller class is outside the guarantee"
    )
