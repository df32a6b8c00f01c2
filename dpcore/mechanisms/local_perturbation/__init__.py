"""Local perturbation — baseline of Lee et al., ISIT 2019, Sec. IV: every record once, with
Gaussian noise.

The whole mechanism: parameters (``params``, none), accountants (``accounting``), the torch
generator (``generate``) and the job around it (``release``), and the audit (``audit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import NOISE_RATIO, SIGMA_Y, Accountant, Key, N, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms.clipping import CLIP_DEFAULT, check_clip_norm
from dpcore.mechanisms.local_perturbation.params import LocalPerturbationParams
from dpcore.mechanisms.spec import (
    Accounting,
    Admission,
    AuditSpec,
    Execution,
    FeatureNoise,
    Guidance,
    MechanismSpec,
    PublicFacts,
    row_shrink,
)

if TYPE_CHECKING:
    from dpcore.accounting.events import NoiseDescription


_MATH = f"{__name__}.accounting"
_GUESSES = "dpcore.accounting.per_record"

TIGHT = Accountant(
    mechanism="local_perturbation",
    name="tight",
    summary="every record released once: Gaussian mechanism, μ = √(2/σ_x² + 2/σ_y²), "
    "exact GDP conversion",
    keys=(
        N,
        Key("d_x", int, "feature dimension (paper accountant only)", required=False),
        Key("d_y", int, "label dimension (paper accountant only)", required=False),
        SIGMA_Y,
        NOISE_RATIO,
    ),
    build=lazy(_MATH, "tight"),
    guess=lazy(_GUESSES, "GUESS_REPLACE_ONE"),
)

PAPER = Accountant(
    mechanism="local_perturbation",
    name="paper",
    summary="the paper's 'random mixing with ℓ = 1': Theorem 1 with ℓ = 1, T = n, "
    "Δ² = d_x/σ_x² + d_y/σ_y²",
    keys=(
        N,
        Key("d_x", int, "feature dimension d_X"),
        Key("d_y", int, "label dimension d_Y (number of classes)"),
        SIGMA_Y,
        NOISE_RATIO,
    ),
    build=lazy(_MATH, "paper"),
    guess=lazy(_GUESSES, "GUESS_REPLACE_ONE"),
    valid_bound=False,
    caveat="treats each released row as a uniformly sampled record (amplification by "
    "sampling), but local perturbation releases every record once",
)


def _check(params: LocalPerturbationParams, facts: PublicFacts) -> None:
    check_clip_norm(params.clip_norm, facts)
    facts.check_rows(facts.n)


def _feature_noise(
    params: LocalPerturbationParams, facts: PublicFacts, noise: NoiseDescription
) -> FeatureNoise:
    import numpy as np

    return FeatureNoise(
        np.full(facts.n_features, noise.sigma("features") * params.clip_norm),
        row_shrink(facts.n_features, params.clip_norm),
        "each released row is one preprocessed record plus this noise on every value",
    )


def _work(params: LocalPerturbationParams, facts: PublicFacts) -> float:
    """Every record once, noised."""
    return float(facts.n) * (facts.n_features + facts.n_classes)


SPEC = MechanismSpec(
    name="local_perturbation",
    params=LocalPerturbationParams,
    # each record's one-hot label plus noise (sigma_y): a noisy class vector.
    label_kind="proportions",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=frozenset({"clip_norm"}),
    ),
    guidance=Guidance(
        essentials=("clip_norm",),
        summary="Baseline: every record once, with Gaussian noise (random-mixing paper, Sec. IV)",
        output="X: n × n_features noisy records (raw units: see the metadata's transform); "
        "y: n × n_classes noisy one-hot labels",
        kind="baseline",
        good_for="A comparison point, not a choice: every record gets the whole noise, so models "
        "trained on it reach chance level at practical ε (balanced accuracy at ε = 1: 0.56 on "
        "make_classification, 0.09 on digits; docs/results/tabular.md)",
        reference='K. Lee, H. Kim, K. Lee, C. Suh, K. Ramchandran, "Synthesizing Differentially '
        'Private Datasets using Random Mixing", IEEE ISIT 2019, Sec. IV (baseline)',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="LocalPerturbationRequest",
        work=_work,
        shape_defaults=(CLIP_DEFAULT,),
        check=_check,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
    ),
    audit=AuditSpec(
        keys=(audit_keys.N, audit_keys.NOISE_RATIO),
        case=lazy(f"{__name__}.audit", "case"),
    ),
)
