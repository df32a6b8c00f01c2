"""ClustMix's parameters (both variants): the one definition the API schema, the accountants'
keys and the worker derive from. Fields of one variant keep their defaults in the other: a
request that sets one of them away from its default under the other variant is refused, never
silently ignored (``foreign_fields``, checked by the spec)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpcore.mechanisms.basis import BASIS_RULE, BasisParams
from dpcore.mechanisms.clipping import ClipNormParams


def _schema_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """The validator's rules in the JSON schema (so that a body valid by the schema is one the
    API accepts): the basis rule, and each variant's foreign fields pinned to their defaults."""

    def pinned(names: frozenset[str]) -> dict[str, Any]:
        fields = cls.model_fields
        return {"properties": {name: {"const": fields[name].default} for name in sorted(names)}}

    paper = {"properties": {"variant": {"const": "paper"}}, "required": ["variant"]}
    rff = {"properties": {"feature_map": {"const": "rff"}}, "required": ["feature_map"]}
    one = {"properties": {"clusters_per_class": {"const": 1}}, "required": ["clusters_per_class"]}
    gaussian = {"properties": {"model": {"const": "gaussian"}}, "required": ["model"]}
    matched = {"properties": {"values": {"const": "matched"}}, "required": ["values"]}
    outside = {"properties": {"detail": {"const": "outside"}}, "required": ["detail"]}
    schema["allOf"] = [
        BASIS_RULE,
        {"if": paper, "then": pinned(DP_ONLY), "else": pinned(PAPER_ONLY)},
        # Sampled rows are already spread; the moment fields are read by model gaussian only.
        {
            "if": gaussian,
            "then": {"properties": {"spread": {"const": 0}}},
            "else": pinned(GAUSSIAN_ONLY),
        },
        # The value histogram's fields are read with values matched only.
        {"if": matched, "else": pinned(MATCHED_ONLY)},
        # The detail's share is read with detail outside only.
        {"if": outside, "else": pinned(DETAIL_ONLY)},
        # DP-KIP adapts centres in the records' space: not with Fourier-feature centres.
        {"if": rff, "then": {"properties": {"dpkip_steps": {"const": 0}}}},
        # ... nor with one cluster per class (nothing to adapt).
        {"if": one, "then": {"properties": {"dpkip_steps": {"const": 0}}}},
    ]


class ClustMixParams(BasisParams, ClipNormParams):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_schema_rules)

    variant: Literal["dp", "paper"] = Field(
        default="dp",
        description="dp (default, accountant tight): every data-dependent step private and "
        "charged — DP k-means per class, then each kept cluster's noisy mean. paper (accountant "
        "paper, research releases only): Algorithm 2 of the paper — random slicing, a "
        "size-constrained GMM, KIP adaptation, Eq. 8 noise — whose clustering, cluster sizes "
        "and adaptation read the data unaccounted: its ε is NOT a bound, so it runs only as an "
        "owner-only research release (`research: true`), charged nothing (docs/privacy.md)",
    )

    clusters_per_class: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="K: clusters per class that DP k-means aims for (bisecting from one per "
        "class; clusters whose noisy count is too small are dropped, so a release may hold "
        "fewer). Each costs nothing extra per se, but more clusters mean smaller ones, whose "
        "noisy means are noisier; every split is one more noisy step. K = 1: no k-means at all "
        "(each class's noisy mean, the whole budget on one step) — the choice for small tables "
        "and for model gaussian",
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
        "rest on the sums, and with model gaussian on the final step's second moments): counts "
        "need far less precision than sums of d coordinates",
    )
    # "means" where the params model is built directly (stored releases from before model
    # existed, tests); a request gets the shape default (gaussian for variant dp).
    model: Literal["means", "gaussian"] = Field(
        default="means",
        description="what the final step releases per kept cluster. means: its noisy sum and "
        "count — each released row is a cluster's noisy mean (repeated). gaussian: also its "
        "noisy second-moment sums over the first moment_dim basis coordinates; each cluster "
        "becomes a Gaussian (noisy mean, noisy covariance shrunk toward its diagonal) and the "
        "released rows are drawn from it (post-processing): distinct rows, usable by trees and "
        "nearest neighbours. Measured on MNIST with one cluster per class, DCT k = 128, "
        "clip_norm 7 and values matched (docs/results/moment_model.md), three seeds: the worst "
        "of six model families 0.754–0.771 at ε = 1 and 0.840–0.850 at ε = 10",
    )
    moment_share: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="model gaussian: the share of the final step's μ² spent on the "
        "second-moment sums (count_share stays the counts'; the sums get the rest, so "
        "count_share + moment_share must be < 1)",
    )
    moment_dim: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="model gaussian: h, the first basis coordinates whose full covariance is "
        "modelled (the others are released at their cluster's noisy mean); at most the basis "
        "dimension. None: min(128, the basis dimension). The noise per covariance entry does "
        "not grow with h, but the entries do (h(h + 1)/2), so the shrinkage leans harder on the "
        "diagonal for large h",
    )
    values: Literal["model", "matched"] = Field(
        default="model",
        description="model gaussian: the released feature values. model — the Gaussian's "
        "samples mapped back from the basis, clipped to the bounds (smooth, with a grey haze "
        "where image strokes are sharp). matched — each value mapped onto a noisy histogram "
        "of every record's feature values (256 levels of the declared range, pooled over the "
        "features, each record weighing 1: sensitivity √2), charged in the final step "
        "(value_share): sampled rows keep the model's shapes and take the data's values. "
        "Pooled over the features, so for image-shaped data only (feature_shape)",
    )
    value_share: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="values matched: the share of the final step's μ² spent on the value "
        "histogram (count_share + moment_share + value_share must be < 1; the sums get the "
        "rest)",
    )
    value_blend: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="values matched: w, each released value is (1 − w)·its model value + "
        "w·its matched level (post-processing; 1: the matched level alone). Unset: chosen "
        "from the fit's covariance shrinkage weights λ (noisy statistics only), "
        "w = clamp(2·(1 − mean λ), ½, 1): the matched level alone sharpens strokes, which lifts "
        "trees, linear models and MLPs, but where the covariances are mostly noise (λ near 1, "
        "low ε) it turns the samples' spread into speckle that costs kNN up to 0.07; half of it "
        'keeps most of the gain there (docs/results/moment_model.md, "Pixel values")',
    )
    detail: Literal["none", "outside"] = Field(
        default="none",
        description="model gaussian with a basis that leaves directions out (k < d): outside — "
        "every sampled row also gets isotropic Gaussian detail in the directions the basis "
        "leaves out, with the records' mean energy there, from one more noisy statistic (every "
        "record's energy outside the basis, summed: sensitivity 1), charged in the final step "
        "(detail_share); none (the default) — the rows live in the basis alone, and a linear "
        "model trained on them weighs the directions where they never vary. On MNIST at ε = 1 "
        "outside lifted ridge by 0.015–0.06 and cost the CNN up to 0.03 "
        '(docs/results/moment_model.md, "Detail outside the basis")',
    )
    detail_share: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="detail outside: the share of the final step's μ² spent on the records' "
        "energy outside the basis (count_share + moment_share + value_share + detail_share "
        "must be < 1; the sums get the rest)",
    )
    drop_below: float = Field(
        default=2.0,
        ge=0,
        description="clusters whose noisy count is below max(drop_below × the counts' noise "
        "std, 1) are pooled, per class, into one (their noisy sums and counts added), itself "
        "dropped when its pooled count is below the same threshold at its pooled noise std "
        "(post-processing of the noisy counts): alone, their noisy means would be mostly "
        "noise. With model gaussian a class that still has clusters after DP k-means but none "
        "kept is not dropped: it is drawn from its noisy statistics padded with that many "
        "pseudo-records at all records' noisy mean and second moment (a class that DP k-means "
        "left without any centre, possible only with clusters_per_class > 1, is not released)",
    )
    n_samples: int | None = Field(
        default=None,
        ge=1,
        description="rows released: None — one per kept cluster (its noisy mean, with its "
        "class), n (the public record count) with model gaussian; a number — that many rows, "
        "the kept clusters' means repeated (model means), or drawn from their Gaussians (model "
        "gaussian), in proportion to their noisy counts (largest remainders), so a model "
        "trained on them weights each cluster by its size. Post-processing either way",
    )
    spread: float = Field(
        default=0.0,
        ge=0,
        le=2,
        description="each released row is its cluster's mean plus Gaussian "
        "jitter of expected L2 norm ≈ spread (std spread/√d per feature, unit scale; drawn "
        "without reading data: post-processing), then clipped back to the domain. Gives "
        "tree models distinct rows to split between. MNIST-10k, K = 8, spread 0 → 0.5 "
        "(docs/results/clustmix_spread.md): HistGradientBoosting 0.20 → 0.69 at ε = 1 and "
        "0.41 → 0.75 at ε = 10; ridge, logistic and MLP within ±0.02 at ε = 1, up to −0.009 at "
        "ε = 10 (1.0: −0.04). Default 0, best for linear models and MLPs; 0.5 for trees. "
        "Model means only (model gaussian samples distinct rows itself)",
    )

    feature_map: Literal["none", "rff"] = Field(
        default="none",
        description="space of the DP k-means: none — the records (unit scale, in the basis); "
        "rff — their random Fourier features (kernel k-means for the rbf kernel of bandwidth "
        "rbf_width, DPGM's Algorithm 2). Fourier features have norm 1 but both signs: a "
        "k-means step then costs μ² = 4/σ_s² (its counts ride free at σ_c = σ_s). The "
        "released means are of the records either way",
    )
    rff_frequencies: int = Field(
        default=200,
        ge=1,
        le=4096,
        description="feature_map rff: d, random frequencies (2d features: cos and sin)",
    )
    rbf_width: float = Field(
        default=0.5,
        gt=0,
        le=100,
        description="bandwidth w of the rbf kernel exp(−‖x − x′‖²/(2w²)) on unit-scale rows "
        "(norm ≤ 1) in the basis: the Fourier features' kernel and DP-KIP's",
    )
    dpkip_steps: int = Field(
        default=0,
        ge=0,
        le=10000,
        description="DP-KIP: DP-SGD steps on the KIP loss that adapt the k-means centres "
        "(kernel ridge regression from the centres, labelled by their classes, to the real "
        "records) before the final assignment; 0 — none. Each step: a Poisson batch (rate "
        "dpkip_batch/n), per-record gradients clipped to dpkip_clip, Gaussian noise. Needs "
        "feature_map none and K > 1",
    )
    dpkip_share: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="DP-KIP: share of the (nominal) μ² given to the DP-KIP steps, the rest to "
        "the k-means and final steps (the ε charged is the PLD composition of both, an upper "
        "bound; the share only splits the noise)",
    )
    dpkip_batch: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="DP-KIP: expected records per step (Poisson sampling at rate "
        "dpkip_batch/n; at most n)",
    )
    dpkip_clip: float = Field(
        default=1.0,
        gt=0,
        le=1e6,
        description="DP-KIP: norm C each record's gradient (over all centres) is clipped to",
    )
    dpkip_lr: float = Field(
        default=0.01, gt=0, le=10, description="DP-KIP: Adam's step size on the noisy gradients"
    )
    dpkip_ridge: float = Field(
        default=1e-3, gt=0, le=1e6, description="DP-KIP: λ, the kernel ridge"
    )

    # ---- variant paper (Algorithm 2 of the paper; research releases only) ----
    cluster_size: int | None = Field(
        default=None,
        ge=2,
        description="variant paper: l_min, the least records of any cluster. Give it, or "
        "sigma_max with a target ε (then l_min = the least l whose Eq. 8 σ at that ε is "
        "≤ sigma_max, as Algorithm 2 line 2, recorded here in the release's parameters); "
        "given, it wins over sigma_max",
    )
    sigma_max: float | None = Field(
        default=None,
        gt=0,
        description="variant paper: σ_max, the largest noise std of any cluster (Algorithm 2's "
        "input); with a target ε it fixes l_min (cluster_size)",
    )
    slice_rows: int = Field(
        default=2000,
        ge=2,
        le=5000,
        description="variant paper: random slicing — each class is cut into regions of about "
        "this many records along a random direction; the GMM, its size constraint and the "
        "memberships are solved per region (the exact constrained assignment takes m² memory "
        "and up to m³ time for a region of m records: 5000 is 200 MB)",
    )
    gmm_iters: int = Field(
        default=30,
        ge=0,
        le=1000,
        description="variant paper: EM iterations of the isotropic GMM per region before the "
        "size-constrained assignment (0: size-constrained k-means from random centres)",
    )
    alpha: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="variant paper: α of Eq. 6, the weight of staying near the GMM centroids "
        "(1: no adaptation) against the KIP kernel-ridge loss (0: KIP alone)",
    )
    ridge: float = Field(
        default=1e-3, gt=0, description="variant paper: λ, the kernel ridge of Eq. 6"
    )
    kernel: Literal["rbf", "ntk"] = Field(
        default="rbf",
        description="variant paper: KIP's kernel — rbf exp(−‖x − x′‖²/(2·D·w²)), or the NTK "
        "of a fully-connected ReLU network of ntk_depth hidden layers",
    )
    kernel_width: float = Field(
        default=0.25,
        gt=0,
        description="variant paper: w of the rbf kernel, per feature (features in [0, 1]; "
        "the bandwidth is w√D)",
    )
    ntk_depth: int = Field(
        default=1, ge=1, le=8, description="variant paper: hidden layers of the NTK"
    )
    kip_steps: int = Field(
        default=100,
        ge=0,
        le=100000,
        description="variant paper: Adam steps of the KIP adaptation (0: none)",
    )
    kip_lr: float = Field(default=0.01, gt=0, description="variant paper: Adam's step size")
    kip_batch: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="variant paper: real records per KIP step (the targets of Eq. 6)",
    )


def foreign_fields(params: ClustMixParams) -> list[str]:
    """The fields of the other variant set away from their defaults (refused by the spec's
    check, after the dataset is known: a body the schema allows is never a 422 of parsing)."""
    return _changed(params, PAPER_ONLY if params.variant == "dp" else DP_ONLY)


def _changed(params: ClustMixParams, names: frozenset[str]) -> list[str]:
    """Those of ``names`` set away from their defaults, sorted."""
    fields = type(params).model_fields
    return sorted(name for name in names if getattr(params, name) != fields[name].default)


# The fields only one variant reads (n_samples applies to both).
DP_ONLY: frozenset[str] = frozenset(
    {
        "clusters_per_class",
        "kmeans_refine",
        "kmeans_share",
        "count_share",
        "model",
        "moment_share",
        "moment_dim",
        "values",
        "value_share",
        "value_blend",
        "detail",
        "detail_share",
        "drop_below",
        "spread",
        "basis",
        "basis_dim",
        "feature_map",
        "rff_frequencies",
        "rbf_width",
        "dpkip_steps",
        "dpkip_share",
        "dpkip_batch",
        "dpkip_clip",
        "dpkip_lr",
        "dpkip_ridge",
    }
)


def means_foreign_fields(params: ClustMixParams) -> list[str]:
    """The fields of model gaussian set away from their defaults under model means."""
    if params.model == "gaussian":
        return []
    return _changed(params, GAUSSIAN_ONLY)


def detail_foreign_fields(params: ClustMixParams) -> list[str]:
    """The fields of detail outside set away from their defaults under detail none."""
    if params.detail == "outside":
        return []
    return _changed(params, DETAIL_ONLY)


def unmatched_foreign_fields(params: ClustMixParams) -> list[str]:
    """The fields of values matched set away from their defaults under values model."""
    if params.values == "matched":
        return []
    return _changed(params, MATCHED_ONLY)


# The fields only model gaussian reads (pinned to their defaults under model means).
GAUSSIAN_ONLY: frozenset[str] = frozenset(
    {"moment_share", "moment_dim", "values", "value_share", "value_blend", "detail", "detail_share"}
)
# The fields only detail outside reads (pinned to their defaults under detail none).
DETAIL_ONLY: frozenset[str] = frozenset({"detail_share"})
# The fields only values matched reads (pinned to their defaults under values model).
MATCHED_ONLY: frozenset[str] = frozenset({"value_share", "value_blend"})
PAPER_ONLY: frozenset[str] = frozenset(
    {
        "cluster_size",
        "sigma_max",
        "slice_rows",
        "gmm_iters",
        "alpha",
        "ridge",
        "kernel",
        "kernel_width",
        "ntk_depth",
        "kip_steps",
        "kip_lr",
        "kip_batch",
    }
)
