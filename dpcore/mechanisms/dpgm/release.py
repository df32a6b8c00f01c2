"""A DPGM release job (Algorithm 1 with the changes docs/privacy.md states):

1. DP kernel k-means within each class on random Fourier features of the unit-scale rows
   (``dpcore.mechanisms.kmeans``, shared with ClustMix; none when K = 1), then the final
   disjoint assignment of every record to its nearest centre and the clusters' noisy sizes.
2. One network per cluster, all trained together by DP-SGD with adaptive clipping (``dpsgd``)
   on the records scaled to [0, 1] by the declared bounds.
3. ``n_samples`` records drawn from the mixture (clusters in proportion to their noisy sizes),
   each labelled with its cluster's class; optionally the weights (safetensors).
Everything after the noisy sizes and the last DP-SGD step is post-processing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpcore.mechanisms import float_error, segments
from dpcore.mechanisms.apportion import apportion
from dpcore.mechanisms.contract import ExtraArtifact, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.dpgm import accounting
from dpcore.mechanisms.dpgm.dpsgd import SGDSettings, train
from dpcore.mechanisms.dpgm.models import RBM, VAE, Params, family
from dpcore.mechanisms.dpgm.params import DEFAULT_LR, DPGMParams
from dpcore.mechanisms.kmeans import (
    COUNT_SENSITIVITY,
    Centres,
    FourierFeatures,
    StepNoise,
    assign,
    dp_kmeans,
    kmeans_steps,
)
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import RowTransform, scale_to_unit, unit_features

# Records per chunk of the k-means assignment (memory ≈ chunk × (clusters + 2d)).
ASSIGN_CHUNK = 4096
# Released rows per chunk.
ROW_CHUNK = 4096
# Clusters whose noisy count is below this many count-noise stds are pooled per class (as
# ClustMix's default): post-processing of the k-means' noisy counts.
DROP_BELOW = 2.0

PREPROCESSING = {
    "features": "clip to the declared feature_range, scale to [0, 1] (no row normalisation); "
    "the networks model each feature in [0, 1]; released rows are their means",
    "labels": "one-hot: each cluster's class, exact (clusters are formed within classes)",
    "statistics": "none computed from the data",
}


def torch_generator(source: SecureRandom) -> torch.Generator:
    """A torch generator (on the CPU: the same draws whatever the device) keyed from the
    release's secure source, for randomness the analysis does not treat as secret (initial
    weights, reparametrisation, Gibbs chains, sampling from the trained networks): DP-SGD's
    bound holds for every value of it."""
    generator = torch.Generator()
    generator.manual_seed(int(source.integers(2**63, 1)[0]))
    return generator


def _per_class(n_classes: int, device: torch.device) -> Centres:
    """One network per class (no centres: its records are its class's)."""
    return Centres(
        torch.zeros((n_classes, 1), dtype=torch.float64, device=device),
        torch.arange(n_classes, device=device),
    )


def release(params: DPGMParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    device = ctx.device
    n, d = data.X.shape
    n_classes = len(data.classes)
    epochs = params.epochs
    # Features in [0, 1] for the networks; unit-scale rows (norm ≤ 1) for the k-means.
    X = torch.as_tensor(scale_to_unit(data.X, data.lo, data.hi), dtype=torch.float32, device=device)
    groups = torch.as_tensor(data.labels, device=device)
    steps_k = kmeans_steps(params.clusters_per_class, params.kmeans_refine)
    sigma_k = ctx.sigma("kmeans")
    fourier = None
    fell_back = False
    if steps_k:
        Z = torch.as_tensor(
            unit_features(data.X, data.lo, data.hi), dtype=torch.float64, device=device
        )
        fourier = FourierFeatures.draw(
            d, params.rff_frequencies, params.rbf_width, ctx.generator, device
        )
        row_error = float_error.stored_rows(1.0)
        centres = dp_kmeans(
            Z,
            groups,
            n_classes,
            clusters=params.clusters_per_class,
            refine=params.kmeans_refine,
            noise=StepNoise(sigma_k, sigma_k),
            sampler=ctx.sampler,
            generator=ctx.generator,
            error=fourier.sum_error(row_error, terms=n),
            drop_below=DROP_BELOW,
            chunk=ASSIGN_CHUNK,
            progress=lambda done, total: ctx.report(0, epochs, f"dp kernel k-means {done}/{total}"),
            features=fourier,
        )
        if len(centres):
            assignment = assign(Z, groups, centres, chunk=ASSIGN_CHUNK, features=fourier)
        else:
            # Every cluster's noisy size fell below the drop threshold (released values): one
            # network per class instead (post-processing of the k-means' output).
            centres, assignment = _per_class(n_classes, device), groups.clone()
            fell_back = True
        del Z
    else:
        # One cluster per class: every record joins its class's network, no data read.
        centres, assignment = _per_class(n_classes, device), groups.clone()
    models = len(centres)
    # The final clusters' noisy sizes (charged with the k-means: accounting.DPGMEvent).
    # Records of no cluster (their class lost every centre) are counted in an extra bin that
    # is dropped: the work never depends on how many they are.
    counts = torch.bincount(segments.outside(assignment, models), minlength=models + 1)
    counts = counts[:models].double()
    sizes = ctx.sampler(counts[:, None], sigma=sigma_k, sensitivity=COUNT_SENSITIVITY)[:, 0]

    net = family(params.model, d, params.hidden, params.latent_dim)
    public = torch_generator(ctx.generator)

    def normal(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=public).to(device)

    def uniform(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.rand(shape, generator=public).to(device)

    weights = net.init(models, normal)
    batch, steps = accounting.sgd_schedule(params.batch_size, epochs, n)
    settings = SGDSettings(
        steps=steps,
        batch=batch,
        sigma=ctx.sigma("gradients"),
        sigma_norm=ctx.sigma("norm_histogram"),
        clip_max=params.clip_max,
        bins=params.norm_bins,
        lr=params.learning_rate or DEFAULT_LR[params.model],
    )
    trained = train(
        net,
        weights,
        X,
        assignment,
        sizes,
        settings,
        sampler=ctx.sampler,
        generator=ctx.generator,
        normal=normal,
        uniform=uniform,
        progress=lambda done, total: ctx.report(
            done * epochs / total, epochs, f"dp-sgd epoch {done * epochs / total:.2f}/{epochs:g}"
        ),
    )
    del X
    ctx.report(epochs, epochs, "sampling")
    # Post-processing from here: noisy sizes, trained weights, public randomness.
    share = sizes.clamp_min(0.0).cpu().numpy()
    rows = params.n_samples or n
    repeats = apportion(share, rows) if share.sum() > 0 else apportion(np.ones(models), rows)
    classes = centres.groups.cpu().numpy()
    artifacts: tuple[ExtraArtifact, ...] = ()
    if params.weights:
        artifacts = (_weights_artifact(trained, net, params, classes, share, data),)
    return ReleaseOutput(
        rows=rows,
        feature_names=list(data.feature_names),
        chunks=_samples(net, trained, repeats, classes, n_classes, normal, public),
        preprocessing={
            **PREPROCESSING,
            "clusters": (
                f"{models} clusters from {steps_k} DP kernel k-means steps on "
                f"{2 * params.rff_frequencies} random Fourier features (rbf width "
                f"{params.rbf_width:g}) within each class, up to {params.clusters_per_class} "
                "per class"
                if steps_k and not fell_back
                else f"{models}: one per class"
                + (" (every k-means cluster's noisy size fell below the threshold)" * fell_back)
            ),
            "model": f"{params.model}, hidden {params.hidden}"
            + (f", latent {params.latent_dim}" if params.model == "vae" else "")
            + f"; {steps} DP-SGD steps (batch rate {batch}/{n})",
            "rows": "each cluster's network sampled in proportion to its noisy size "
            "(largest remainders); a row is the network's mean given a latent (vae) or hidden "
            "(rbm) draw",
        },
        artifacts=artifacts,
        progress="own",
        # The networks read and write [0, 1] features, unclipped (DP-SGD bounds the rest).
        transform=RowTransform.unit_range(data.lo, data.hi, None),
    )


def _samples(
    net: VAE | RBM,
    weights: Params,
    repeats: np.ndarray,
    classes: np.ndarray,
    n_classes: int,
    normal: Any,
    public: torch.Generator,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``repeats[m]`` rows of network m, in a random order (public randomness), by chunks."""
    device = weights[net.names()[0]].device
    order = torch.as_tensor(np.repeat(np.arange(len(repeats)), repeats), device=device)
    order = order[torch.randperm(order.shape[0], generator=public).to(device)]
    cluster_class = torch.as_tensor(classes, device=device)
    for start in range(0, order.shape[0], ROW_CHUNK):
        models = order[start : start + ROW_CHUNK]
        with torch.no_grad():
            rows = net.sample_rows(weights, models, normal).float()
        labels = torch.nn.functional.one_hot(cluster_class[models], n_classes).to(rows.dtype)
        yield rows, labels


def _weights_artifact(
    weights: Params,
    net: VAE | RBM,
    params: DPGMParams,
    classes: np.ndarray,
    sizes: np.ndarray,
    data: PrivateData,
) -> ExtraArtifact:
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in weights.items()}
    tensors["cluster_class"] = torch.as_tensor(classes, dtype=torch.int64)
    tensors["cluster_noisy_size"] = torch.as_tensor(sizes, dtype=torch.float64)
    header = {
        "model": params.model,
        "hidden": str(params.hidden),
        "latent_dim": str(params.latent_dim) if isinstance(net, VAE) else "",
        "features": json.dumps(list(data.feature_names)),
        "classes": json.dumps([str(c) for c in data.classes]),
        "input_scale": "features clipped to the declared feature_range and scaled to [0, 1]",
        "layout": "first axis of every weight: the cluster's network; cluster_class[m] is the "
        "class index of network m",
    }

    def write(path: Path) -> None:
        from safetensors.torch import save_file

        save_file(tensors, str(path), metadata=header)

    return ExtraArtifact(
        name="weights.safetensors",
        media_type="application/octet-stream",
        description=f"the {len(classes)} trained {params.model.upper()} networks (safetensors)",
        write=write,
    )


def preprocess_test(metadata: Any, extra: Any, X: np.ndarray) -> np.ndarray:
    """Real records into the release's space: [0, 1] per feature by the declared bounds."""
    lo = np.asarray(metadata["feature_range"]["lo"])
    hi = np.asarray(metadata["feature_range"]["hi"])
    return scale_to_unit(X, lo, hi)
