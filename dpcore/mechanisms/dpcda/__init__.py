"""DP-CDA — class-centric mixing: per class, noisy means of ℓ records of that class;
class-balanced output with exact labels.

The whole mechanism: parameters (``params``), accountants (``accounting``: ``paper`` and
``tight``, with DP standardisation statistics composed in), the torch generator
(``generate``) and the job around it (``release``), and the audit (``audit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import Accountant, Key, N, lazy
from dpcore.mechanisms import basis
from dpcore.mechanisms.clipping import DEFAULT_RULE, check_clip_norm, default_clip_norm
from dpcore.mechanisms.dpcda.params import DPCDAParams, neighbour_relation
from dpcore.mechanisms.postprocess import RELEASE_ONLY
from dpcore.mechanisms.sharding import ShardSpec
from dpcore.mechanisms.spec import (
    MIXING_DEGREE_RULE,
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
    mixing_degree,
    row_shrink,
    rows_default,
)

if TYPE_CHECKING:
    from dpcore.accounting.events import NoiseDescription


_MATH = f"{__name__}.accounting"

_KEYS = (
    N,
    Key.of(
        DPCDAParams, "mixture_degree", help="ℓ: distinct records of one class averaged per mixture"
    ),
    Key.of(DPCDAParams, "n_samples", help="T: mixtures released in all (⌈T/K⌉ per class)"),
    Key.of(DPCDAParams, "clip_norm", help="C: every standardised record is clipped to L2 norm ≤ C"),
    Key.of(
        DPCDAParams,
        "standardization",
        help="unit_range: features in [0, 1], records ≤ √2·C apart (sensitivity √2·C/ℓ); "
        "declared/dp: z-scored, signs free (2C/ℓ)",
    ),
    Key("n_classes", int, "K: number of classes"),
    Key.of(
        DPCDAParams,
        "min_class_size",
        help="m: public floor on every class's size (≥ mixture_degree); dp: the DP lower "
        "bounds must reach it for the release to mix",
    ),
    Key.of(
        DPCDAParams,
        "class_sizes",
        help="dp (default): noisy counts (count_noise) give DP lower bounds, charged, failure "
        "probability added to δ; declared: m assumed of both neighbours (checked on the data; "
        "a narrower neighbour relation)",
    ),
    Key.of(
        DPCDAParams,
        "count_noise",
        help="dp class sizes: noise std of each class count (default: when calibrating, the "
        "larger of m/(4·Φ⁻¹(1 − 10⁻⁹/K)) and the noise at which the counts take a tenth of the "
        "target's GDP μ²; at a given σ, the first)",
    ),
    Key.of(
        DPCDAParams,
        "class_size_failure_prob",
        help="dp class sizes: β, the chance a DP lower bound is wrong (δ grows by (1 + e^ε)β; "
        "default: min(1e-9, 10⁻³·δ/(1 + e^ε)) when calibrating, else 1e-9)",
    ),
    Key.of(
        DPCDAParams,
        "stats_noise",
        help="noise std of DP-estimated standardisation "
        "statistics, composed in (default: none, statistics declared public)",
    ),
    Key("d_x", int, "feature dimension (needed with stats_noise)", required=False),
)

PAPER = Accountant(
    mechanism="dpcda",
    name="paper",
    summary="WBK subsampled-without-replacement RDP (q = ℓ/m, z = σℓ/R) over the ⌈T/K⌉ "
    "mixtures of one class; misses records that change class",
    keys=_KEYS,
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess"),
    valid_bound=False,
    caveat=(
        "ignores that a replaced record can change class (one class loses a record, "
        "another gains one)"
    ),
)

TIGHT = Accountant(
    mechanism="dpcda",
    name="tight",
    summary="max over orders of WBK within a class (T_c mixtures) and, for a record "
    "changing class, 2·T_c Poisson-subsampled Gaussians (q = ℓ/m, z = σℓ/R; R = √2·C "
    "for unit_range, else 2C)",
    keys=_KEYS,
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess"),
    prepare=lazy(_MATH, "prepare"),
)


def _check(params: DPCDAParams, facts: PublicFacts) -> None:
    basis.check(params, facts)
    if params.standardization == "unit_range":
        check_clip_norm(params.clip_norm, facts)
    if params.mixture_degree > params.min_class_size:
        raise InvalidParams(
            f"min_class_size {params.min_class_size} must be at least mixture_degree "
            f"{params.mixture_degree}"
        )
    if facts.n_classes * params.min_class_size > facts.n:
        # Public figures: no dataset of n records has every class this large.
        raise InvalidParams(
            f"min_class_size {params.min_class_size} × {facts.n_classes} classes exceeds the "
            f"dataset's {facts.n} rows: no class split reaches it; declare a smaller one"
        )
    if params.class_sizes == "declared" and facts.class_counts is None:
        raise InvalidParams("this dataset predates class counts; upload it again to use dpcda")
    # The opt-in neighbour restriction of class_sizes 'declared' (stated on the release and
    # its ledger entry): whether a release exists depends on the private counts, so its ε
    # holds only over datasets whose every class has ≥ m records. The default 'dp' reads no
    # private count here (docs/privacy.md, "Where private data decides admit, refuse,
    # succeed or fail").
    if params.class_sizes == "declared" and params.min_class_size > min(facts.class_counts or ()):
        raise InvalidParams(
            f"min_class_size {params.min_class_size} is not a lower bound of every class's "
            "size in this dataset; declare a smaller one"
        )
    for name in ("feature_mean", "feature_std"):
        values = getattr(params, name)
        if values is not None and len(values) != facts.n_features:
            raise InvalidParams(f"{name} needs {facts.n_features} values, got {len(values)}")
    k = facts.n_classes
    facts.check_rows(k * (-(-params.n_samples // k)))


#: A class this close to the size it must certify (relative to a balanced class) is likely to
#: miss it: the preview warns below it.
MIX_WARNING_SHARE = 0.75


def _warnings(
    params: DPCDAParams, facts: PublicFacts, noise: NoiseDescription
) -> list[dict[str, str]]:
    """With DP class sizes, the size every class must hold for the release to mix: its DP
    lower bound sits count_noise·Φ⁻¹(1 − β/K) below the noisy count (``accounting_counts``),
    so a class mixes only from about min_class_size plus that margin. Warned when that
    exceeds three quarters of a balanced class (n/K: public): the release is then likely
    noise alone, charged all the same."""
    from dpcore.mechanisms.dpcda.accounting_counts import bound_margin

    if params.class_sizes != "dp":
        return []
    classes = max(1, facts.n_classes)
    beta = float(noise.analysis["class_size_failure_prob"])
    margin = bound_margin(noise.sigma("counts"), beta, classes)
    need = params.min_class_size + margin
    balanced = facts.n / classes
    if need <= MIX_WARNING_SHARE * balanced:
        return []
    return [
        {
            "code": "classes_may_not_mix",
            "message": f"with class_sizes 'dp' each class's DP lower bound sits about "
            f"{margin:.0f} records below its noisy count, so this release mixes only if every "
            f"class holds about {need:.0f} records or more (min_class_size "
            f"{params.min_class_size} plus that margin; a balanced class here holds "
            f"{balanced:.0f}). Otherwise every row is noise alone, charged all the same: "
            "lower min_class_size, raise ε, or declare the class sizes (class_sizes "
            "'declared', a narrower neighbour relation)",
        }
    ]


def _feature_noise(
    params: DPCDAParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    from dpcore.mechanisms.dpcda.release import BASIS_DIM

    if params.standardization != "unit_range":
        # z-scored features: the noise is per (declared or DP) standard deviation, not per
        # declared range.
        return FeatureNoise(
            None,
            1.0,
            f"standardization {params.standardization!r}: features are z-scored, so the noise "
            f"(σ = {noise.sigma('features'):.4g}) is in standard deviations, not in the "
            "columns' ranges",
        )
    return FeatureNoise(
        basis.unit_noise(params, facts, BASIS_DIM, noise.sigma("features")),
        row_shrink(facts.n_features, params.clip_norm),
        "each released row is the mean of ℓ preprocessed records of one class plus this "
        "noise on every value",
    )


def _shard_refusal(params: DPCDAParams) -> str | None:
    """DP-CDA's rows are i.i.d. within each class, ⌈T/k⌉ per class (one unit = k rows); but DP
    statistics and DP class sizes are drawn before the rows, once per release: a shard would
    draw its own."""
    if params.standardization == "dp":
        return "DP standardisation statistics are drawn once per release"
    if params.class_sizes == "dp":
        return "DP class sizes are drawn once per release"
    return None


def _work(params: DPCDAParams, facts: PublicFacts) -> float:
    """Reading the records into the basis, then T mixtures of ℓ rows of the basis's width."""
    from dpcore.mechanisms.dpcda.release import BASIS_DIM

    width = basis.dimension(params, facts, BASIS_DIM) + facts.n_classes
    rows = params.n_samples * params.mixture_degree * width
    return basis.projection_work(params, facts, BASIS_DIM) + rows


SPEC = MechanismSpec(
    name="dpcda",
    params=DPCDAParams,
    # each mixture is of one class's records: its class is exact.
    label_kind="exact",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=frozenset({"feature_mean", "feature_std", *RELEASE_ONLY}),
        relation=neighbour_relation,
    ),
    guidance=Guidance(
        essentials=("mixture_degree", "n_samples", "min_class_size", "class_sizes"),
        summary="Class-centric mixing (DP-CDA): per class, noisy means of ℓ records of that "
        "class; class-balanced output, exact labels",
        output="X: K·⌈T/K⌉ × n_features noisy class mixtures (standardised, clipped "
        "scale); y: their one-hot classes (exact)",
        good_for="Labelled tables and images whose every class has many rows: the best mixing "
        "mechanism measured (with declared class sizes, the studies' public datasets: MNIST "
        "ε = 1: 0.77–0.81 with every model family, trees included; on the tables of "
        "docs/results/tabular.md: 0.78 logistic balanced accuracy on breast-cancer at ε = 10, "
        "0.68 on make_classification at ε = 1); the default DP class sizes add noisy counts, "
        "whose noise grows at small ε (they take at most a tenth of the target's μ²), so "
        "small classes at small ε may not reach min_class_size: such a release is noise "
        "alone (metadata mixed: false)",
        reference="DP-CDA: An Algorithm for Enhanced Privacy Preservation in Dataset Synthesis "
        "Through Randomized Mixing",
        feature_noise=_feature_noise,
        warnings=_warnings,
    ),
    admission=Admission(
        title="DPCDARequest",
        work=_work,
        shape_defaults=(
            # Half a balanced class: public figures only. With class sizes 'dp' (the default) a
            # class mixes when its DP lower bound reaches it (≥ 1.25 of it plus a few
            # count_noise at the public count_noise rule; more where the target raises
            # count_noise); with 'declared' admission checks it against the private counts.
            # count_noise is no shape default: it depends on the target (ε, δ), so the
            # accountant's ``prepare`` chooses it (``params.count_noise_for_target``).
            ShapeDefault(
                "min_class_size",
                "max(⌊n / (2·classes)⌋, mixture_degree if given, 1): half of a balanced class "
                "(public figures only); with class_sizes dp the DP lower bounds must reach it "
                "for the release to mix, with declared it is checked against the class counts",
                lambda values, facts: max(
                    facts.n // (2 * max(1, facts.n_classes)), values.get("mixture_degree") or 1, 1
                ),
            ),
            ShapeDefault(
                "mixture_degree",
                f"{MIXING_DEGREE_RULE}, at most min_class_size",
                lambda values, facts: min(mixing_degree(facts.n), values["min_class_size"]),
            ),
            rows_default(per_class=True),
            ShapeDefault(
                "clip_norm",
                f"standardization unit_range: {DEFAULT_RULE}; declared or dp: 1",
                lambda values, facts: (
                    default_clip_norm(facts)
                    if values.get("standardization", "unit_range") == "unit_range"
                    else 1.0
                ),
            ),
        ),
        check=_check,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
        distributed=lazy(f"{__name__}.distributed", "job"),
        shard=ShardSpec(
            "n_samples",
            unit=lambda p, k: k,
            refuse=_shard_refusal,
            exceptions="with standardization 'dp' or class_sizes 'dp'",
        ),
    ),
    audit=AuditSpec(
        # Its own ``n`` rather than the shared ``dpcore.audit.keys.N``: the audit runs one
        # class, whose size is n.
        keys=(
            Key(
                "n", int, "records, all of one class (= min_class_size)", required=False, default=2
            ),
            Key.of(DPCDAParams, "mixture_degree", help="ℓ", default=2),
            Key.of(DPCDAParams, "n_samples", help="T: mixtures per release", default=4),
            Key.of(DPCDAParams, "clip_norm", help="C"),
            Key(
                "standardization",
                str,
                "unit_range (records √2·C apart) or declared (2C apart)",
                required=False,
                default="unit_range",
                choices=("unit_range", "declared"),
            ),
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
    evaluation=EvaluationHints(preprocess_test=lazy(f"{__name__}.release", "preprocess_test")),
)
