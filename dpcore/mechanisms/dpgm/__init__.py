"""DPGM — DP kernel k-means and a mixture of generative networks trained with DP-SGD (Acs,
Melis, Castelluccia, De Cristofaro).

The whole mechanism: parameters (``params``), accountants (``accounting``: ``tight``, the
PLD bound every release is charged, and ``paper``, Theorem 4, for ``dprelease account``), the
networks (``models``: VAE, RBM), DP-SGD with adaptive clipping (``dpsgd``), the job around
them (``release``) and the audit (``audit``). DP kernel k-means is
``dpcore.mechanisms.kmeans``, shared with ClustMix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcore.accounting.accountant import Accountant, Key, N, lazy
from dpcore.audit import keys as audit_keys
from dpcore.mechanisms import float_error
from dpcore.mechanisms.dpgm.params import DPGMParams, network_size
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
)

if TYPE_CHECKING:
    from dpcore.accounting.events import NoiseDescription


_MATH = f"{__name__}.accounting"
PAPER_LAMBDA_MAX = 32
# DP-SGD steps one release may run (a public limit on the job's length).
MAX_SGD_STEPS = 1_000_000


_COMMON = (
    N,
    Key.of(DPGMParams, "batch_size", help="L: expected batch size; Poisson sampling, q = L/n"),
    Key.of(DPGMParams, "epochs", help="DP-SGD epochs (T_S = ⌈epochs·n/L⌉ unless sgd_steps)"),
    Key("sgd_steps", int, "T_S: DP-SGD steps (overrides epochs)", required=False),
    Key.of(DPGMParams, "clusters_per_class", help="K: clusters per class (T_K from K)"),
    Key.of(DPGMParams, "kmeans_refine", help="Lloyd steps after the last split (T_K from it)"),
    Key(
        "kmeans_iterations",
        int,
        "T_K: DP kernel k-means iterations (default: 1 + ⌈log₂ K⌉ + kmeans_refine, 0 for K = 1)",
        required=False,
    ),
    Key.of(DPGMParams, "kmeans_share", help="share of μ² (central-limit) on k-means and sizes"),
    Key(
        "sigma_kmeans",
        float,
        "σ_K: noise std on cluster sizes, and per C_s on cluster feature sums (paper: √2·σ′_K); "
        "default from kmeans_share",
        required=False,
    ),
    Key.of(DPGMParams, "norm_noise", help="σ_C/σ_S unless sigma_norm is given"),
    Key(
        "sigma_norm",
        float,
        "σ_C: noise std per DPNorm histogram bin (paper: √2·σ′_C); default norm_noise·σ_S",
        required=False,
    ),
    Key(
        "rbf",
        str,
        "true: RBF kernel, Fourier features of norm exactly the public C_s = 1, no DPNorm in "
        "k-means",
        required=False,
        default="true",
        choices=("true", "false"),
    ),
    Key("d_x", int, "feature dimension (not used by the DPGM accountants)", required=False),
    Key("d_y", int, "label dimension (not used by the DPGM accountants)", required=False),
    Key(
        "lambda_max",
        int,
        "largest integer moment order λ of Theorem 4 (paper accountant only)",
        required=False,
        default=PAPER_LAMBDA_MAX,
    ),
)

TIGHT = Accountant(
    mechanism="dpgm",
    name="tight",
    summary="k-means as exact GDP (μ = 2/σ_K per iteration), DP-SGD's norm histogram and "
    "gradient as one Poisson-subsampled Gaussian per step; PLD accountant, replace-one",
    keys=_COMMON,
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess_sigma"),
)

PAPER = Accountant(
    mechanism="dpgm",
    name="paper",
    summary="Acs et al. Theorem 4: Eq. 3 (Lemma 1) for k-means, Eq. 4 (Hölder weights, "
    "E1/E2 by numerical integration) for DP-SGD, integer λ ≤ lambda_max",
    keys=_COMMON,
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess_sigma"),
    valid_bound=False,
    # Theorem 4 analyses the paper's Algorithm 1 (a cluster picked per step by its private
    # size); the service runs the tight pipeline only.
    releases=False,
    caveat="Lemma 1 halves the Gaussian's moment, the k-means sum's replace-one "
    "sensitivity is 2·C_s (not √2·C_s) and E1/E2 are the add/remove pair: the paper's ε "
    "can be below the true replace-one ε",
)


def _check(params: DPGMParams, facts: PublicFacts) -> None:
    from dpcore.mechanisms.dpgm.accounting import sgd_schedule

    batch, steps = sgd_schedule(params.batch_size, params.epochs, facts.n)
    if batch > facts.n:
        raise InvalidParams(f"batch_size {batch} exceeds the dataset's {facts.n} records")
    if steps > MAX_SGD_STEPS:
        raise InvalidParams(
            f"epochs {params.epochs:g} at batch_size {batch} make {steps} DP-SGD "
            f"steps; at most {MAX_SGD_STEPS} (raise batch_size or lower epochs)"
        )
    if params.clusters_per_class > 1:  # K = 1 runs no k-means
        from dpcore.mechanisms.kmeans import check_rbf_width

        check_rbf_width(
            k=facts.n_features,
            frequencies=params.rff_frequencies,
            width=params.rbf_width,
            terms=facts.n,
            # The job's rows: float32 as stored (``float_error.stored_rows``).
            input_error=float_error.stored_rows(1.0),
        )
    facts.check_rows(params.n_samples or facts.n)


def _noise_widths(params: DPGMParams, facts: PublicFacts) -> dict[str, int]:
    """The widest draw of each noise: every network's whole gradient at once (one network per
    class and cluster), the norm histogram, the k-means' Fourier features and sizes."""
    models = params.clusters_per_class * facts.n_classes
    size = network_size(params.model, facts.n_features, params.hidden, params.latent_dim)
    return {
        "gradients": models * size,
        "norm_histogram": params.norm_bins,
        "kmeans": max(2 * params.rff_frequencies, facts.n_features, models),
    }


def _feature_noise(params: DPGMParams, facts: PublicFacts, noise: NoiseDescription) -> FeatureNoise:
    return FeatureNoise(
        None,
        1.0,
        "the noise is added to the networks' training gradients (DP-SGD), not to the released "
        "records: no per-value noise figure applies",
    )


def _work(params: DPGMParams, facts: PublicFacts) -> float:
    """The k-means' steps over the records' Fourier features, then every DP-SGD step: the
    batch's per-record gradients (a forward and a backward pass, and their norms) and the
    noise on every network's parameters, then the samples' decoding."""
    from dpcore.mechanisms.dpgm.accounting import sgd_schedule

    batch, steps = sgd_schedule(params.batch_size, params.epochs, facts.n)
    models = params.clusters_per_class * facts.n_classes
    size = network_size(params.model, facts.n_features, params.hidden, params.latent_dim)
    kmeans = 0.0
    if params.clusters_per_class > 1:
        kmeans_steps = 2 + params.clusters_per_class.bit_length() + params.kmeans_refine
        fourier = 2 * params.rff_frequencies
        kmeans = kmeans_steps * float(facts.n) * fourier * (facts.n_features + models)
    training = float(steps) * (3 * batch + models) * size
    return kmeans + training + float(params.n_samples or facts.n) * size


SPEC = MechanismSpec(
    name="dpgm",
    params=DPGMParams,
    # one generator per class's cluster: each sample's class is exact.
    label_kind="exact",
    accounting=Accounting(
        accountants=(TIGHT, PAPER),
        release_only=frozenset(
            {
                "model",
                "hidden",
                "latent_dim",
                "rff_frequencies",
                "rbf_width",
                "clip_max",
                "norm_bins",
                "learning_rate",
                "n_samples",
                "weights",
            }
        ),
    ),
    guidance=Guidance(
        essentials=("model", "epochs", "n_samples"),
        summary="DP kernel k-means within each class, then one generative network per cluster "
        "(VAE or RBM) trained by DP-SGD with adaptive clipping; releases records drawn from the "
        "mixture (Acs et al.)",
        output="X: n_samples records drawn from the trained networks (features in [0, 1] by the "
        "declared bounds: each row a network's mean for a random latent); y: one-hot, each "
        "network's class (exact). Optional second artifact: the weights (safetensors)",
        good_for="Fresh records from generative networks (one per class and cluster) at large ε, "
        "with a GPU: MNIST ε = 10 logistic 0.81, but 0.62 at ε = 1 where DP-CDA and ClustMix "
        "reach 0.80 (docs/results/sweet_spot.md); slow",
        reference='G. Acs, L. Melis, C. Castelluccia, E. De Cristofaro, "Differentially Private '
        'Mixture of Generative Neural Networks", IEEE TKDE 2018',
        feature_noise=_feature_noise,
    ),
    admission=Admission(
        title="DPGMRequest",
        work=_work,
        check=_check,
        noise_widths=_noise_widths,
    ),
    execution=Execution(
        release=lazy(f"{__name__}.release", "release"),
        # Training jobs: the GPU workers' queue (CPU-only deployments run a worker on both).
        queue="gpu",
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(
                DPGMParams,
                "batch_size",
                help="L: expected batch of the audited step, q = L/n; None: n (q = 1)",
                default=None,
            ),
            Key.of(
                DPGMParams,
                "norm_noise",
                help="σ_C/σ_S; 1000: the histogram's share of the claim ~1e-6 (served: 4)",
                default=1000.0,
            ),
        ),
        case=lazy(f"{__name__}.audit", "case"),
    ),
    evaluation=EvaluationHints(preprocess_test=lazy(f"{__name__}.release", "preprocess_test")),
)
