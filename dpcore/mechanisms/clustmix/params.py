"""ClustMix's parameters (variant ``dp``): the one definition the API schema, the accountants'
keys and the worker derive from."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from dpcore.mechanisms.basis import BASIS_RULE, BasisParams


class ClustMixParams(BasisParams):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [BASIS_RULE]})

    clusters_per_class: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="K: clusters per class that DP k-means aims for (bisecting from one per "
        "class; clusters whose noisy count is too small are dropped, so a release may hold "
        "fewer). Each costs nothing extra per se, but more clusters mean smaller ones, whose "
        "noisy means are noisier; every split is one more noisy step. K = 1: no k-means at all "
        "(each class's noisy mean, the whole budget on one step) — the choice for small tables",
    )
    kmeans_refine: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Lloyd steps after the last split (each one more noisy step). The k-means "
        "runs 1 + ⌈log₂ K⌉ + kmeans_refine steps (none when K = 1)",
    )
    kmeans_share: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="share of the privacy loss (of μ², GDP) spent on the k-means steps, in "
        "equal parts; the rest on the released cluster sums and counts",
    )
    count_share: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="within each step, the share of its μ² spent on the cluster counts (the "
        "rest on the sums): counts need far less precision than sums of d coordinates",
    )
    drop_below: float = Field(
        default=2.0,
        ge=0,
        description="clusters whose noisy count is below drop_below × the counts' noise std "
        "are pooled, per class, into one (their noisy sums and counts added), itself dropped "
        "when its pooled count is below drop_below × its pooled noise std (post-processing of "
        "the noisy counts): alone, their noisy means would be mostly noise",
    )
    n_samples: int | None = Field(
        default=None,
        ge=1,
        description="rows released: None — one per kept cluster (its noisy mean, with its "
        "class); a number — that many rows, the kept clusters' means repeated in proportion "
        "to their noisy counts (largest remainders), so a model trained on them weights each "
        "cluster by its size. Post-processing either way",
    )
    spread: float = Field(
        default=0.0,
        ge=0,
        le=2,
        description="each released row is its cluster's mean plus Gaussian "
        "jitter of expected L2 norm ≈ spread (std spread/√d per feature, unit scale; drawn "
        "without reading data: post-processing), then clipped back to the domain. Gives "
        "tree models distinct rows to split between. MNIST-10k, spread 0 → 0.5, one release "
        "each: ε = 10, K = 32: HistGradientBoosting 0.30 → 0.75, sklearn MLP 0.856 → 0.847; "
        "ε = 1, K = 8: HistGradientBoosting 0.10 → 0.66, sklearn MLP 0.766 → 0.768",
    )
