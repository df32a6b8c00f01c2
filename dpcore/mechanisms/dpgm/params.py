"""DPGM's release parameters: the one definition the API schema, the accountants' keys and the
worker derive from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Learning rates when ``learning_rate`` is not given: Adam for the VAE (the paper's optimiser,
# at the rate measured best: docs/results/defaults.md), plain SGD for the RBM (the paper's
# 0.01).
DEFAULT_BATCH = 2000
DEFAULT_LR = {"vae": 5e-3, "rbm": 0.01}


def batch_size_for(batch_size: int | None, n: int) -> int:
    """L: the given batch size, or the default min(2000, ⌈n/5⌉) (public: n is)."""
    if batch_size is not None:
        return batch_size
    return max(1, min(DEFAULT_BATCH, -(-n // 5)))


def network_size(model: str, d: int, hidden: int, latent: int) -> int:
    """Parameters of one network (``models``' shapes): the values of every DP-SGD step's
    noisy gradient per network."""
    if model == "rbm":
        return d * hidden + d + hidden
    return 2 * d * hidden + 3 * hidden * latent + 2 * hidden + 2 * latent + d


class DPGMParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Literal["vae", "rbm"] = Field(
        default="vae",
        description="generative network per cluster: vae — a variational autoencoder with one "
        "hidden layer in encoder and decoder (Bernoulli decoder on features scaled to [0, 1]); "
        "rbm — a restricted Boltzmann machine trained by persistent contrastive divergence",
    )
    hidden: int = Field(
        default=200,
        ge=1,
        le=4096,
        description="hidden units of every network (the paper's 200)",
    )
    latent_dim: int = Field(
        default=2,
        ge=1,
        le=256,
        description="model vae: dimension of the latent space (the paper's 2)",
    )
    clusters_per_class: int = Field(
        default=1,
        ge=1,
        le=64,
        description="K: clusters per class found by DP kernel k-means, one network each. Records "
        "of different classes never share a cluster, so every network generates one class and "
        "its samples carry that label exactly. K = 1: no k-means (one network per class); use "
        "K > 1 for data without labels (one class) or classes with several modes. Every network "
        "gets noise on all its parameters at every step, so more clusters cost utility",
    )
    kmeans_refine: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Lloyd steps after the last split: DP kernel k-means runs T_K = 1 + "
        "⌈log₂ K⌉ + kmeans_refine noisy steps (none when K = 1)",
    )
    kmeans_share: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="share of the privacy loss (μ² in the central-limit view of DP-SGD) spent on "
        "the k-means steps and the clusters' noisy sizes; the split only sets the noise scales, "
        "the ε charged is the PLD accountant's of the whole pipeline",
    )
    rff_frequencies: int = Field(
        default=200,
        ge=1,
        le=4096,
        description="d: random Fourier frequencies of the DP kernel k-means (2d features, cos "
        "and sin: every feature vector has norm exactly 1)",
    )
    rbf_width: float = Field(
        default=0.5,
        gt=0,
        le=100,
        description="bandwidth w of the k-means' rbf kernel exp(−‖x − x′‖²/(2w²)) on unit-scale "
        "rows (L2 norm ≤ 1)",
    )
    epochs: float = Field(
        default=20.0,
        gt=0,
        le=1000,
        description="DP-SGD epochs: T_S = ⌈epochs · n / batch_size⌉ steps",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="L: expected batch; every step draws each record independently with "
        "probability q = L/n (Poisson sampling, as the accountant assumes). Default "
        "min(2000, ⌈n/5⌉): DP-SGD's noise is shared by the batch, so large batches and few "
        "steps fare best at small ε",
    )
    norm_noise: float = Field(
        default=4.0,
        gt=0,
        le=1000,
        description="σ_C/σ_S: noise of DPNorm's histogram of gradient norms relative to the "
        "gradients' noise multiplier. The histogram and the gradient of a step are charged "
        "together, as one step whose replaced record moves them by √(2/σ_C² + 4/σ_S²) noise "
        "stds, so 4 adds ~3 % to the step's μ²",
    )
    clip_max: float = Field(
        default=2.0,
        gt=0,
        le=1e6,
        description="C_max of DPNorm (Alg. 3): the clip threshold of every step is the upper "
        "edge of the noisy mode of a histogram of the batch's gradient norms over norm_bins "
        "equal bins of (0, C_max] (norms above C_max count in the last bin)",
    )
    norm_bins: int = Field(default=50, ge=2, le=10000, description="w: DPNorm's bins")
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        le=10,
        description=(
            f"step size: Adam's for vae (default {DEFAULT_LR['vae']:g}), "
            f"SGD's for rbm (default {DEFAULT_LR['rbm']:g})"
        ),
    )
    n_samples: int | None = Field(
        default=None,
        ge=1,
        description="records drawn from the trained mixture (clusters in proportion to their "
        "noisy sizes); default n. Post-processing: any number costs nothing more",
    )
    weights: bool = Field(
        default=False,
        description="also ship every network's weights as a second artifact (safetensors)",
    )
