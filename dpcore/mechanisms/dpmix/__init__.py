"""DPMix — random mixing (Lee et al., ISIT 2019): T noisy means of ℓ records.

The whole mechanism: parameters (``params``), accountants (``accounting_pld`` for ``tight``, on
the RDP events of ``accounting``; ``accounting_paper`` for ``paper``), the torch generator
(``generate``) and the job around it (``release``), the audit (``audit``), and the
least-squares correction (``learning``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import NOISE_RATIO, SIGMA_Y, Accountant, Key, N, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms import basis
from dpcore.mechanisms.clipping import CLIP_DEFAULT, check_clip_norm
from dpcore.mechanisms.dpmix.params import DPMixParams
from dpcore.mechanisms.postprocess import RELEASE_ONLY
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


_TIGHT = f"{__name__}.accounting_pld"
_PAPER = f"{__name__}.accounting_paper"

_COMMON = (
    N,
    Key.of(DPMixParams, "mixture_degree"),
    Key.of(DPMixParams, "n_samples"),
    SIGMA_Y,
    NOISE_RATIO,
)
_ASSIGNMENT = Key.of(
    DPMixParams,
    "assignment",
    help="mixture: each mixture draws ℓ records (Thm 1); record: each record joins Tp "
    "mixtures (Thm 3)",
)

TIGHT = Accountant(
    mechanism="dpmix",
    name="tight",
    summary="mixture assignment: privacy loss distribution of the symmetric dominating pair "
    "of sampling without replacement (Dong–Roth–Su Thm 4.2) composed over T, or the RDP "
    "bound (WBK Thm 27) where smaller; record assignment: Gaussian mechanism (GDP); "
    "sensitivity √2/ℓ for features and labels",
    keys=(
        *_COMMON,
        Key("d_x", int, "feature dimension (used by the paper accountant only)", required=False),
        Key("d_y", int, "label dimension (used by the paper accountant only)", required=False),
        _ASSIGNMENT,
    ),
    build=lazy(_TIGHT, "build"),
    guess=lazy(_TIGHT, "guess_sigma"),
)

PAPER = Accountant(
    mechanism="dpmix",
    name="paper",
    summary="Lee et al. Thm 1 (mixture assignment) or Thm 3 (record assignment) as printed, "
    "with the paper's sensitivity Δ² = d_x/σ_x² + d_y/σ_y²",
    keys=(
        *_COMMON,
        Key("d_x", int, "feature dimension d_X"),
        Key("d_y", int, "label dimension d_Y (number of classes)"),
        _ASSIGNMENT,
    ),
    build=lazy(_PAPER, "paper"),
    guess=lazy(_PAPER, "guess_paper"),
)


def _check(params: DPMixParams, facts: PublicFacts) -> None:
    basis.check(params, facts)
    check_clip_norm(params.clip_norm, facts)
    if params.mixture_degree > facts.n:
        raise InvalidParams(
            f"mixture_degree {params.mixture_degree} exceeds the dataset's {facts.n} rows"
        )
    facts.check_rows(params.n_samples)


def _feature_noise(
    params: DPMixParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    from dpcore.mechanisms.dpmix.release import BASIS_DIM

    return FeatureNoise(
        basis.unit_noise(params, facts, BASIS_DIM, noise.sigma("features") * params.clip_norm),
        row_shrink(facts.n_features, params.clip_norm),
        "each released row is the mean of ℓ preprocessed records plus this noise on every value",
    )


def _work(params: DPMixParams, facts: PublicFacts) -> float:
    """Reading the records into the basis, then T mixtures of ℓ rows of the basis's width."""
    from dpcore.mechanisms.dpmix.release import BASIS_DIM

    width = basis.dimension(params, facts, BASIS_DIM) + facts.n_classes
    rows = params.n_samples * params.mixture_degree * width
    return basis.projection_work(params, facts, BASIS_DIM) + rows


SPEC = MechanismSpec(
    name="dpmix",
    params=DPMixParams,
    # mixed one-hot labels plus noise: a noisy class vector per row.
    label_kind="proportions",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=RELEASE_ONLY | {"clip_norm"},
    ),
    guidance=Guidance(
        essentials=("mixture_degree", "n_samples"),
        summary="Random mixing (Lee et al., ISIT 2019): T noisy means of ℓ records",
        output="X: n_samples × n_features noisy mixtures (raw units: see the metadata's "
        "transform); y: n_samples × n_classes noisy mixed one-hot labels",
        good_for="Image-like data with many rows (n in the thousands) for ridge or linear models; "
        "below DP-CDA and ClustMix on every measured table and on MNIST (0.61 ridge at ε = 1)",
        reference='K. Lee, H. Kim, K. Lee, C. Suh, K. Ramchandran, "Synthesizing Differentially '
        'Private Datasets using Random Mixing", IEEE ISIT 2019',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="DPMixRequest",
        work=_work,
        shape_defaults=(
            ShapeDefault(
                "mixture_degree",
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
        distributed=lazy(f"{__name__}.distributed", "job"),
        # Mixture assignment: every mixture draws its own subset and noise, so the rows are i.i.d.
        # given the data. Record assignment is not: each record joins k mixtures, shared by rows.
        shard=ShardSpec(
            "n_samples",
            refuse=lambda p: (
                "record assignment ties rows together" if p.assignment == "record" else None
            ),
            exceptions="with assignment 'record'",
        ),
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(DPMixParams, "mixture_degree", help="ℓ", default=2),
            Key.of(DPMixParams, "n_samples", help="T: mixtures per release", default=4),
            Key.of(DPMixParams, "assignment", help="mixture or record"),
            audit_keys.NOISE_RATIO,
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
)
