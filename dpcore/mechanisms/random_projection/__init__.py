"""Random projection — baseline of Lee et al., ISIT 2019, Sec. IV: every record projected by
a data-independent Gaussian matrix, then noised.

The whole mechanism: parameters (``params``), accountants (``accounting``), the torch
generator (``generate``) and the job around it (``release``), and the audit (``audit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import NOISE_RATIO, SIGMA_Y, Accountant, Key, N, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms.clipping import CLIP_DEFAULT, check_clip_norm
from dpcore.mechanisms.random_projection.params import RandomProjectionParams
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
_GUESSES = "dpcore.accounting.per_record"

_KEYS = (
    N,
    Key.of(
        RandomProjectionParams,
        "projection_dim",
        help="d: rows of the projection matrix R (d × d_x)",
    ),
    Key.of(
        RandomProjectionParams,
        "spectral_norm",
        help="s: spectral norm R is rescaled to (data-independent)",
    ),
    Key(
        "formula",
        str,
        "paper accountant only: sqrt_sum = s√(log(1/(2δ)) + ε)/ε as printed, "
        "sqrt_log = s(√log(1/(2δ)) + ε)/ε",
        required=False,
        default="sqrt_sum",
        choices=("sqrt_sum", "sqrt_log"),
    ),
    Key("d_x", int, "feature dimension (not used by the accountants)", required=False),
    Key("d_y", int, "label dimension (not used by the accountants)", required=False),
    SIGMA_Y,
    NOISE_RATIO,
)

TIGHT = Accountant(
    mechanism="random_projection",
    name="tight",
    summary="every record released once as R x + noise: Gaussian mechanism, "
    "μ = √(2s²/σ² + 2/σ_y²), exact GDP conversion",
    keys=_KEYS,
    build=lazy(_MATH, "tight"),
    guess=lazy(_GUESSES, "GUESS_REPLACE_ONE"),
)

PAPER = Accountant(
    mechanism="random_projection",
    name="paper",
    summary="the paper's noise σ = s·√(log(1/(2δ)) + ε)/ε inverted for ε (features and "
    "labels as one Gaussian in the paper's unit-difference convention)",
    keys=_KEYS,
    build=lazy(_MATH, "paper"),
    guess=lazy(_GUESSES, "GUESS_UNIT_DIFFERENCE"),
    valid_bound=False,
    caveat="the printed noise lacks the factor √2 of the cited Gaussian bound and takes "
    "sensitivity s, while replace-one moves R x by up to √2·s",
)


def _check(params: RandomProjectionParams, facts: PublicFacts) -> None:
    check_clip_norm(params.clip_norm, facts)
    if params.projection_dim > facts.n_features:
        raise InvalidParams(
            f"projection_dim {params.projection_dim} exceeds the dataset's "
            f"{facts.n_features} features"
        )
    facts.check_rows(facts.n)


def _feature_noise(
    params: RandomProjectionParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    return FeatureNoise(
        None,
        row_shrink(facts.n_features, params.clip_norm),
        f"released features are {params.projection_dim} random projections of each record, "
        f"not its columns: each carries noise σ = {noise.sigma_x:.4g} on a projection of "
        f"spectral norm {params.spectral_norm:g}",
    )


def _work(params: RandomProjectionParams, facts: PublicFacts) -> float:
    """Every record projected once, noised."""
    return float(facts.n) * (facts.n_features * params.projection_dim + facts.n_classes)


SPEC = MechanismSpec(
    name="random_projection",
    params=RandomProjectionParams,
    # each record's one-hot label plus noise (sigma_y): a noisy class vector.
    label_kind="proportions",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=frozenset({"clip_norm"}),
    ),
    guidance=Guidance(
        essentials=("projection_dim",),
        summary="Baseline: every record projected by a data-independent Gaussian matrix "
        "then noised (random-mixing paper, Sec. IV)",
        output="X: n × projection_dim noisy projections; y: n × n_classes noisy one-hot "
        "labels; NPZ also holds the projection matrix",
        kind="baseline",
        good_for="A comparison point, not a choice: each projected record gets the whole noise, "
        "so models trained on it reach chance level at practical ε (balanced accuracy at ε = 1: "
        "0.50 on make_classification, 0.10 on digits; docs/results/tabular.md)",
        reference='K. Lee, H. Kim, K. Lee, C. Suh, K. Ramchandran, "Synthesizing Differentially '
        'Private Datasets using Random Mixing", IEEE ISIT 2019, Sec. IV (baseline)',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="RandomProjectionRequest",
        work=_work,
        shape_defaults=(
            # The benches' choice on MNIST (its bench module), never more than the features.
            ShapeDefault(
                "projection_dim",
                "min(50, the dataset's features)",
                lambda values, facts: min(50, facts.n_features),
            ),
            CLIP_DEFAULT,
        ),
        check=_check,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(RandomProjectionParams, "projection_dim", help="d", default=8),
            Key.of(RandomProjectionParams, "spectral_norm", help="s"),
            audit_keys.NOISE_RATIO,
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
    # Projected features lose the image shape.
    evaluation=EvaluationHints(
        preprocess_test=lazy(f"{__name__}.release", "preprocess_test"), image_features=False
    ),
)
