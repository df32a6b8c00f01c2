"""SGDRM — SGD on random mixtures (Lee et al., ICLR 2018 workshop): T noisy random
combinations of records, to learn from with bias-corrected SGD.

The whole mechanism: parameters (``params``), accountants (``accounting``: ``paper``,
Theorem 1 as printed, and ``tight``, clipped or coupled Gaussian coefficients), the torch
generator (``generate``) and the job around it (``release``), the audit (``audit``) and the
least-squares correction (``learning``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import Accountant, Key, N, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms import basis
from dpcore.mechanisms.clipping import CLIP_DEFAULT, check_clip_norm
from dpcore.mechanisms.postprocess import RELEASE_ONLY
from dpcore.mechanisms.sgdrm.params import SGDRMParams
from dpcore.mechanisms.sharding import ShardSpec
from dpcore.mechanisms.spec import (
    MIXING_DEGREE_RULE,
    Accounting,
    Admission,
    AuditSpec,
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

_COMMON = (
    N,
    Key.of(
        SGDRMParams, "mixture_width", help="ℓ: each record enters a mixture with probability ℓ/n"
    ),
    Key.of(SGDRMParams, "n_samples"),
)

PAPER = Accountant(
    mechanism="sgdrm",
    name="paper",
    summary="Lee et al. 2018 Theorem 1 as printed (closed-form condition on σ², solved for "
    "ε by a bracketing root finder); needs δ < 1.46ℓ/n; reproduction only",
    keys=_COMMON,
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess_paper"),
    valid_bound=False,
    caveat=(
        "Theorem 1 assumes bounded per-record influence but SGDRM's Gaussian coefficients "
        "are unbounded"
    ),
    # Theorem 1 is about the paper's unclipped coefficients.
    assumes={"coefficients": "gaussian", "coefficient_bound": None},
)

TIGHT = Accountant(
    mechanism="sgdrm",
    name="tight",
    summary="coefficients clipped to [−c, c]: T-fold Poisson-subsampled Gaussian (q = ℓ/n, "
    "contribution radius c√2) under replace-one, dp_accounting PLD",
    keys=(
        *_COMMON,
        Key.of(
            SGDRMParams,
            "coefficients",
            help="clipped: g is clipped to [−coefficient_bound, coefficient_bound]; gaussian: "
            "the paper's unbounded g, analysed by coupling with the clipped variant "
            "(coefficient_bound is then the least analysis bound)",
        ),
        Key.of(
            SGDRMParams,
            "coefficient_bound",
            help="c: clip of the Gaussian coefficient g (default 3/√mixture_width)",
        ),
    ),
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess_tight"),
    prepare=lazy(_MATH, "prepare_tight"),
)


def _check(params: SGDRMParams, facts: PublicFacts) -> None:
    basis.check(params, facts)
    check_clip_norm(params.clip_norm, facts)
    if params.mixture_width > facts.n:
        raise InvalidParams(
            f"mixture_width {params.mixture_width} exceeds the dataset's {facts.n} rows"
        )
    facts.check_rows(params.n_samples)


def _feature_noise(
    params: SGDRMParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    from dpcore.mechanisms.sgdrm.release import BASIS_DIM

    return FeatureNoise(
        basis.unit_noise(params, facts, BASIS_DIM, noise.sigma("mixtures") * params.clip_norm),
        row_shrink(facts.n_features, params.clip_norm),
        "each released row is a random signed combination of preprocessed records (about ℓ "
        "of them) plus this noise on every value",
    )


def _work(params: SGDRMParams, facts: PublicFacts) -> float:
    """Reading the records into the basis, ~ℓ draws per mixture (its binomial size, then a
    uniform subset of that size), and T combinations of ~ℓ rows of the basis's width."""
    from dpcore.mechanisms.sgdrm.release import BASIS_DIM

    width = basis.dimension(params, facts, BASIS_DIM) + facts.n_classes
    draws = float(params.n_samples) * params.mixture_width
    rows = params.n_samples * params.mixture_width * width
    return basis.projection_work(params, facts, BASIS_DIM) + draws + rows


SPEC = MechanismSpec(
    name="sgdrm",
    params=SGDRMParams,
    # signed random combinations of one-hot labels, noisy: released as drawn.
    label_kind="combinations",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=RELEASE_ONLY | {"clip_norm"},
    ),
    guidance=Guidance(
        essentials=("mixture_width", "n_samples"),
        summary="SGD on random mixtures (Lee et al., ICLR 2018 WS): T noisy mixtures with "
        "random coefficients b·clip(g, −c, c) (or the paper's unclipped b·g), "
        "b ~ Bern(ℓ/n), g ~ N(0, 1/ℓ)",
        output="X: n_samples × n_features noisy random combinations (in raw units' scale, not "
        "shifted: see the metadata's transform); "
        "y: the same combinations of one-hot labels, noisy; learn with "
        "dpcore.learning.bias_corrected_sgd",
        good_for="Training a linear or softmax model with the bias-corrected SGD it ships "
        "(dpcore.learning.bias_corrected_sgd); its rows are signed combinations, not records, so "
        "off-the-shelf models trained on them fare poorly",
        reference='K. Lee, K. Lee, H. Kim, C. Suh, K. Ramchandran, "SGD on Random Mixtures: '
        'Private Machine Learning under Data Breach Threats", ICLR 2018 workshop',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="SGDRMRequest",
        work=_work,
        shape_defaults=(
            ShapeDefault(
                "mixture_width",
                MIXING_DEGREE_RULE,
                lambda values, facts: mixing_degree(facts.n),
            ),
            rows_default(),
            CLIP_DEFAULT,
        ),
        check=_check,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
        # Every combination draws its own inclusion (size and subset) and its own noise.
        shard=ShardSpec("n_samples"),
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(SGDRMParams, "mixture_width", help="ℓ", default=1),
            Key.of(SGDRMParams, "n_samples", help="T: mixtures per release", default=1),
            # Small enough that nearly every coefficient sits at ±c, as the accountant's
            # worst case does (the service's default is 3/√ℓ).
            Key.of(SGDRMParams, "coefficient_bound", help="c", default=0.1),
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
)
