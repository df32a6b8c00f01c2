"""ClustMix — cluster-based mixing from "Approximate, Adapt, Anonymize (3A)" (Madl et al.).

Variant ``dp`` (the default): every data-dependent step private and charged — DP k-means per
class (``dpcore.mechanisms.kmeans``), then each kept cluster's noisy sum over its noisy count
(``release``), accounted by ``tight`` (``accounting.ClustMixDPEvent``).

Variant ``paper``: the paper's Algorithm 2 (``paper``: random slicing, size-constrained GMM, KIP
adaptation, Eq. 8 noise per cluster), accounted by ``paper``. Eq. 8 charges only the final
averaging, so its ε is not a bound: the service runs it only as an owner-only research release
(``research: true``), charged nothing. ``fixed`` evaluates the averaging alone over a clustering
fixed in advance — an algorithm nobody runs, so ``dprelease account`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dpcore.accounting.accountant import Accountant, Key, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms import basis, float_error
from dpcore.mechanisms.clipping import (
    DEFAULT_RULE,
    check_clip_norm,
    default_clip_norm,
    is_image,
)
from dpcore.mechanisms.clustmix.params import (
    PAPER_ONLY,
    ClustMixParams,
    detail_foreign_fields,
    foreign_fields,
    means_foreign_fields,
    unmatched_foreign_fields,
)
from dpcore.mechanisms.spec import (
    Accounting,
    Admission,
    AuditSpec,
    EvaluationHints,
    Execution,
    FeatureNoise,
    Guidance,
    InvalidParams,
    MechanismSpec,
    PublicFacts,
    ShapeDefault,
    row_shrink,
)

if TYPE_CHECKING:
    from dpcore.accounting.events import NoiseDescription


_MATH = f"{__name__}.accounting"


# The dp variant's parameters that its accountant reads; the reproduction accountants accept
# them (one key set per mechanism) and ignore them.
_DP_KEYS = (
    Key.of(ClustMixParams, "clusters_per_class", help="K: clusters per class DP k-means aims for"),
    Key.of(ClustMixParams, "kmeans_refine", help="Lloyd steps after the last split"),
    Key.of(ClustMixParams, "kmeans_share", help="share of μ² spent on the k-means steps"),
    Key.of(ClustMixParams, "count_share", help="share of each step's μ² spent on the counts"),
    Key.of(ClustMixParams, "model", help="means, or gaussian: also noisy second moments"),
    Key.of(
        ClustMixParams,
        "moment_share",
        help="model gaussian: share of the final step's μ² on the second moments",
    ),
    Key.of(ClustMixParams, "values", help="model gaussian: model, or matched (a value histogram)"),
    Key.of(
        ClustMixParams,
        "value_share",
        help="values matched: share of the final step's μ² on the value histogram",
    ),
    Key.of(
        ClustMixParams,
        "detail",
        help="model gaussian: none, or outside (the records' energy outside the basis)",
    ),
    Key.of(
        ClustMixParams,
        "detail_share",
        help="detail outside: share of the final step's μ² on the energy outside the basis",
    ),
    Key.of(ClustMixParams, "feature_map", help="none, or rff: k-means on Fourier features"),
    Key.of(ClustMixParams, "dpkip_steps", help="DP-KIP steps (0: none)"),
    Key.of(ClustMixParams, "dpkip_share", help="share of the nominal μ² on the DP-KIP steps"),
    Key.of(ClustMixParams, "dpkip_batch", help="DP-KIP's expected batch (q = dpkip_batch/n)"),
)


def _unused(key: Key) -> Key:
    return Key(
        key.name,
        key.kind,
        f"{key.help} (variant dp; not read by this accountant)",
        required=False,
        default=key.default,
        minimum=key.minimum,
        strict=key.strict,
    )


_CLUSTER_SIZE = Key("cluster_size", int, "l: public lower bound on every cluster's size")

PAPER = Accountant(
    mechanism="clustmix",
    name="paper",
    summary="Madl et al. Eq. 8: μ = √(CD)/(lσ)-GDP for the final noisy averaging only, "
    "converted exactly; reproduction only (variant paper, research releases)",
    keys=(
        Key(
            "cluster_size",
            int,
            "l = l_min: every cluster's least size (or give sigma_max with a target ε)",
            required=False,
        ),
        Key(
            "sigma_max",
            float,
            "σ_max: with a target ε, l_min is the least l whose Eq. 8 σ is ≤ σ_max",
            required=False,
        ),
        Key("n_classes", int, "C: number of classes"),
        Key("n_features", int, "D: feature dimension"),
        *(_unused(k) for k in _DP_KEYS),
    ),
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess_paper"),
    prepare=lazy(_MATH, "prepare_paper"),
    assumes={"variant": "paper"},
    valid_bound=False,
    caveat=(
        "Eq. 8 counts only the final noisy averaging; the GMM clustering, cluster sizes "
        "and KIP adaptation are data-dependent and unaccounted"
    ),
)

FIXED = Accountant(
    mechanism="clustmix",
    name="fixed",
    summary="final noisy averaging over a clustering fixed in advance, records clipped to "
    "norm 1: Gaussian mechanism with L2 sensitivity max(2/l, 2√2/(l+1)) (GDP); for "
    "comparison with Eq. 8 — a clustering of the data itself is not covered",
    keys=(
        _CLUSTER_SIZE,
        Key("n_classes", int, "C (used by the paper accountant only)", required=False),
        Key("n_features", int, "D (used by the paper accountant only)", required=False),
        *(_unused(k) for k in _DP_KEYS),
    ),
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess_tight"),
    valid_bound=False,
    caveat="covers the averaging step only, for a clustering that does not read the data",
    # A clustering that reads no data is not what either variant runs: offline only.
    releases=False,
    assumes={"variant": "paper", "sigma_max": None},
)

TIGHT = Accountant(
    mechanism="clustmix",
    name="tight",
    summary="variant dp: 1 + ⌈log₂ K⌉ + refine DP k-means steps and the final step, each a "
    "Gaussian mechanism on every cluster's (sum, count) of records of norm ≤ 1 "
    "(μ² = 2/σ_s² + 2/σ_c²; 4/σ_s² per k-means step on Fourier features; model gaussian adds "
    "2/σ₂² to the final step for every cluster's second-moment sums, values matched "
    "2/σ_v² for the values' histogram and detail outside 1/σ_e² for the energy outside the "
    "basis), composed as GDP "
    "and converted exactly; with DP-KIP, composed with its Poisson-subsampled Gaussian steps "
    "in dp_accounting's PLD accountant (replace-one)",
    keys=(*_DP_KEYS, Key("n", int, "number of records (public; DP-KIP's q)", required=False)),
    build=lazy(_MATH, "dp"),
    guess=lazy(_MATH, "guess_dp"),
    assumes={"variant": "dp", "cluster_size": None, "sigma_max": None},
)


def _noise_widths(params: ClustMixParams, facts: PublicFacts) -> dict[str, int]:
    """The widest draw of each noise: second moments (upper triangle plus the diagonal tail),
    the values' histogram, DP-KIP's gradient of every centre at once, k-means sums (Fourier
    features or records) and every centre's count."""
    from dpcore.mechanisms.values import BINS

    d = facts.n_features
    centres = params.clusters_per_class * facts.n_classes
    return {
        "second": d * (d + 1) // 2 + d,
        "values": BINS,
        "detail": 1,
        "kip": centres * d,
        "kmeans_sums": max(2 * params.rff_frequencies, d),
        "kmeans_counts": centres,
        "counts": centres,
    }


def _check(params: ClustMixParams, facts: PublicFacts) -> None:
    foreign = foreign_fields(params)
    if foreign:
        raise InvalidParams(
            f"{', '.join(foreign)} {'does' if len(foreign) == 1 else 'do'} not apply to "
            f"variant {params.variant}"
        )
    gaussian_only = means_foreign_fields(params)
    if gaussian_only:
        raise InvalidParams(
            f"{', '.join(gaussian_only)} {'applies' if len(gaussian_only) == 1 else 'apply'} "
            "to model gaussian only"
        )
    basis.check(params, facts)
    check_clip_norm(params.clip_norm, facts)
    if params.feature_map == "rff":
        from dpcore.mechanisms.kmeans import check_rbf_width

        check_rbf_width(
            k=facts.n_features,
            frequencies=params.rff_frequencies,
            width=params.rbf_width,
            terms=facts.n,
            # Above the basis's rounding (``Basis.excess``; float64, orders below float32's
            # unit): conservative, it refuses only widths that fit no data anyway.
            input_error=float_error.INPUT_RELATIVE,
        )
    if params.model == "gaussian":
        _check_gaussian(params, facts)
    if params.dpkip_steps:
        if params.clusters_per_class == 1:
            raise InvalidParams(
                "dpkip_steps needs clusters_per_class > 1: with one cluster per class every "
                "record joins its class's cluster, so there is nothing to adapt"
            )
        if params.feature_map != "none":
            raise InvalidParams(
                "dpkip_steps needs feature_map none: DP-KIP adapts centres in the records' "
                "space, and Fourier-feature centres have none (set dpkip_steps 0, or "
                "feature_map none)"
            )
        if params.dpkip_batch > facts.n:
            raise InvalidParams(
                f"dpkip_batch {params.dpkip_batch} exceeds the dataset's {facts.n} records"
            )
    if params.n_samples is not None:
        facts.check_rows(params.n_samples)
    elif params.model == "gaussian":
        facts.check_rows(facts.n, "n (model gaussian samples n rows by default)")
    else:
        facts.check_rows(
            params.clusters_per_class * facts.n_classes, "clusters_per_class × classes"
        )


def _check_gaussian(params: ClustMixParams, facts: PublicFacts) -> None:
    if params.spread != 0:
        raise InvalidParams(
            "spread applies to model means only: model gaussian draws distinct rows from each "
            "cluster's Gaussian already (set spread 0)"
        )
    if params.count_share + params.moment_share >= 1:
        raise InvalidParams(
            f"count_share {params.count_share:g} + moment_share {params.moment_share:g} must "
            "be < 1: the final step's sums get the rest of its μ²"
        )
    if params.values == "matched":
        if params.count_share + params.moment_share + params.value_share >= 1:
            raise InvalidParams(
                f"count_share {params.count_share:g} + moment_share {params.moment_share:g} + "
                f"value_share {params.value_share:g} must be < 1: the final step's sums get the "
                "rest of its μ²"
            )
        if not is_image(facts):
            raise InvalidParams(
                "values matched pools every feature's values into one histogram: it needs "
                "image-shaped data (declare feature_shape, e.g. [28, 28]); use values model"
            )
    from dpcore.mechanisms.clustmix.release import BASIS_DIM

    dim = basis.dimension(params, facts, BASIS_DIM)
    if params.detail == "outside":
        shares = params.count_share + params.moment_share + params.detail_share
        if params.values == "matched":
            shares += params.value_share
        if shares >= 1:
            raise InvalidParams(
                f"the final step's shares (count_share, moment_share, value_share with values "
                f"matched, detail_share) sum to {shares:g}: they must be < 1, the sums get the "
                "rest of its μ²"
            )
        if dim >= facts.n_features:
            raise InvalidParams(
                "detail outside adds the energy the basis leaves out, and this basis leaves "
                "none out (its dimension is the number of features): use detail none"
            )
    detail_only = detail_foreign_fields(params)
    if detail_only:
        raise InvalidParams(
            f"{', '.join(detail_only)} {'applies' if len(detail_only) == 1 else 'apply'} "
            "to detail outside only"
        )
    matched_only = unmatched_foreign_fields(params)
    if matched_only:
        raise InvalidParams(
            f"{', '.join(matched_only)} {'applies' if len(matched_only) == 1 else 'apply'} "
            "to values matched only"
        )
    if params.moment_dim is not None and params.moment_dim > dim:
        raise InvalidParams(
            f"moment_dim {params.moment_dim} exceeds the basis dimension {dim}: the covariance "
            "is modelled over the first moment_dim basis coordinates"
        )


# Measured: on the small tables (≤ 240 rows per class at δ = 1/n²) K = 16 read chance while
# K = 1 did well (docs/results/tabular.md); on MNIST-10k (1000 rows a class) K = 16 is
# the sweet spot (docs/results/sweet_spot.md). Variant paper keeps the field's default (it does
# not read K; a value away from it would be refused as foreign).
# Model gaussian: one Gaussian per class measured best on MNIST (docs/results/moment_model.md).
CLUSTERS_RULE = (
    "1 below 1000 rows per class (n / classes) or with model gaussian, else 16; variant paper: 16"
)

# Model gaussian samples distinct, in-domain rows that every model family learns from; model
# means releases one noisy mean per cluster, repeated (docs/results/moment_model.md). A request
# that sets spread (an option of model means) keeps model means.
MODEL_RULE = "gaussian for variant dp (means when spread is set); means for variant paper"


def model_default(values: Mapping[str, Any], facts: PublicFacts) -> str:
    if values.get("variant", "dp") == "paper" or values.get("spread"):
        return "means"
    return "gaussian"


# Model gaussian's second moments are noised ∝ C²: on MNIST C = 7 (⌈√d⌉/4) beat ⌈√d⌉/3 and
# ⌈√d⌉/5 did no better (docs/results/moment_model.md, "Clip norm C").
CLIP_RULE = f"⌈√d⌉/4 with model gaussian on image-shaped data (measured); else {DEFAULT_RULE}"


def clip_default(values: Mapping[str, Any], facts: PublicFacts) -> float:
    return default_clip_norm(facts, image_divisor=4 if values.get("model") == "gaussian" else 3)


# Matched values: sampled rows take the data's value distribution (sharp strokes instead of
# a grey haze); pooled over the features, so image-shaped data only (docs/results/
# moment_model.md, "Pixel values").
VALUES_RULE = "matched with model gaussian on image-shaped data (measured); else model"


def values_default(values: Mapping[str, Any], facts: PublicFacts) -> str:
    if values.get("model") == "gaussian" and is_image(facts):
        return "matched"
    return "model"


def clusters_default(values: Mapping[str, Any], facts: PublicFacts) -> int:
    if values.get("variant", "dp") == "paper":
        return int(ClustMixParams.model_fields["clusters_per_class"].default)
    if values.get("model", "means") == "gaussian":
        return 1
    return 1 if facts.n < 1000 * max(1, facts.n_classes) else 16


def _feature_noise(
    params: ClustMixParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    if params.model == "gaussian":
        what = (
            "each released row is drawn from a cluster's Gaussian, whose mean is its noisy sum "
            "over its noisy count (the sums' σ divided by the cluster's size, which is private) "
            "and whose covariance comes from its noisy second-moment sums: sampling spread on "
            "top of the mean's noise"
        )
    else:
        what = (
            "each released row is a cluster's noisy sum over its noisy count: its noise is the "
            "sums' σ divided by the cluster's size, which is private (larger clusters, less "
            "noise)"
        )
    return FeatureNoise(None, row_shrink(facts.n_features, params.clip_norm), what)


def _work(params: ClustMixParams, facts: PublicFacts) -> float:
    """Reading the records into the basis; every k-means step's distances from each record
    to every centre (in the basis, or its Fourier features); second moments (model
    gaussian); DP-KIP's and the paper's KIP steps (each batch record against every centre)
    and the paper's mixture fits; drawing the rows."""
    from dpcore.mechanisms.clustmix.release import BASIS_DIM, MOMENT_DIM

    n, k = float(facts.n), facts.n_classes
    dim = basis.dimension(params, facts, BASIS_DIM)
    centres = params.clusters_per_class * k
    space = 2 * params.rff_frequencies if params.feature_map == "rff" else dim
    steps = 2 + params.clusters_per_class.bit_length() + params.kmeans_refine
    work = basis.projection_work(params, facts, BASIS_DIM) + steps * n * space * centres
    second = 0
    if params.model == "gaussian":
        second = min(params.moment_dim or MOMENT_DIM, dim)
        work += n * second * second
    work += float(params.dpkip_steps) * params.dpkip_batch * centres * (dim + centres)
    if params.variant == "paper":
        work += float(params.kip_steps) * params.kip_batch * centres * (dim + centres)
        work += float(params.gmm_iters) * n * centres * dim
    rows = params.n_samples if params.n_samples is not None else facts.n
    if params.detail == "outside":
        # Every record's energy (n·d), and each row's detail projected out of the basis (2·d·k).
        work += n * facts.n_features + float(rows) * 2 * facts.n_features * dim
    return work + float(rows) * (dim + second * second)


SPEC = MechanismSpec(
    name="clustmix",
    params=ClustMixParams,
    # clusters are formed within classes: each row's class is exact.
    label_kind="exact",
    accounting=Accounting(
        accountants=(TIGHT, PAPER, FIXED),
        release_only=frozenset(
            {
                "clip_norm",
                "basis",
                "basis_dim",
                "drop_below",
                "n_samples",
                "spread",
                "rff_frequencies",
                "rbf_width",
                "dpkip_clip",
                "dpkip_lr",
                "dpkip_ridge",
                "moment_dim",
                "value_blend",
            }
        )
        | (PAPER_ONLY - {"cluster_size", "sigma_max"}),
    ),
    guidance=Guidance(
        essentials=("model", "clusters_per_class", "n_samples"),
        summary="Cluster-based mixing (3A). Variant dp (default): within each class (one "
        "cluster per class by default, or DP k-means clusters), noisy counts, sums and "
        "second moments; every step charged; the released rows are drawn from each cluster's "
        "fitted Gaussian (model gaussian, the default) or are its noisy mean (model means). "
        "Variant paper: the paper's Algorithm 2 (GMM, KIP, Eq. 8), whose ε is not a bound — "
        "owner-only research releases",
        output="X: n rows (or n_samples) drawn from each kept cluster's Gaussian fitted to its "
        "noisy first and second moments (model gaussian), in proportion to the noisy counts, "
        "(with detail outside, given random detail with the records' noisy mean energy in "
        "the directions the basis leaves out), "
        "clipped into the declared bounds (on images, each pixel value mapped onto a noisy "
        "histogram of the data's pixel values, half-way where the fitted covariances are "
        "mostly noise: values matched); with model means one row per "
        "kept cluster (or n_samples rows, clusters repeated by their noisy counts): noisy "
        "cluster means, unit scale; y: their one-hot classes (exact)",
        good_for="Labelled images and tables for any model family: on MNIST with the "
        "defaults, random forest, HGB, kNN, logistic, MLP and CNN score 0.73–0.84 on real test "
        "images at ε = 1 and 0.86–0.93 at ε = 10, all rows distinct and within the bounds "
        "(docs/results/moment_model.md; images uploaded flat need feature_shape); model means "
        "suits linear models and MLPs only (trees need spread 0.5)",
        reference='T. Madl, W. Xu, O. Choudhury, M. Howard, "Approximate, Adapt, Anonymize '
        '(3A): a Framework for Privacy Preserving Training Data Release for Machine Learning"',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="ClustMixRequest",
        work=_work,
        noise_widths=_noise_widths,
        shape_defaults=(
            ShapeDefault("model", MODEL_RULE, model_default),
            ShapeDefault(
                "clusters_per_class",
                CLUSTERS_RULE,
                lambda values, facts: clusters_default(values, facts),
            ),
            ShapeDefault("clip_norm", CLIP_RULE, clip_default),
            ShapeDefault("values", VALUES_RULE, values_default),
        ),
        check=_check,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(ClustMixParams, "count_share", help="share of the step's μ² on the counts"),
            Key.of(ClustMixParams, "model", help="means, or gaussian: the moments step"),
            Key.of(
                ClustMixParams,
                "moment_share",
                help="model gaussian: share of the step's μ² on the second moments",
            ),
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
    # Real records map into [0, 1]^D for variant paper, unit scale for dp.
    evaluation=EvaluationHints(preprocess_test=lazy(f"{__name__}.release", "preprocess_test")),
)
