"""A ClustMix release job. Variant ``dp``: unit-scale preprocessing, a public basis, DP k-means
per class (``dpcore.mechanisms.kmeans``), then one more noisy step on the final clusters; each
released row is a kept cluster's noisy sum over its noisy count, mapped back from the basis.
Variant ``paper``: ``paper.release`` (Algorithm 2 of the paper)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.clustmix import accounting, dpkip, paper
from dpcore.mechanisms.clustmix.params import ClustMixParams
from dpcore.mechanisms.clustmix.rows import Jitter, cluster_rows, row_repeats, to_domain
from dpcore.mechanisms.contract import UNIT_SCALE, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.kmeans import (
    Centres,
    FourierFeatures,
    StepNoise,
    dp_kmeans,
    drop_threshold,
    kmeans_steps,
    step,
    survivors,
)
from dpcore.preprocessing import scale_to_unit, unit_features

# k of the default basis on image-shaped data (clustering and noise in 128 DCT coefficients),
# the best measured on MNIST (docs/results/defaults.md). Cluster means are smooth: 128
# coefficients keep their strokes, and more only spread the noise over detail the means do not
# have.
BASIS_DIM = 128
# Records per chunk of the assignment (memory ≈ chunk × clusters distances).
ASSIGN_CHUNK = 4096


def release(params: ClustMixParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    if params.variant == "paper":
        return paper.release(params, data, ctx)
    transform = unit_transform(data, params.clip_norm)
    features, _ = unit_scale(data, ctx.device, transform)
    basis = basis_for(params, tuple(data.feature_shape), features.shape[1], BASIS_DIM)
    # Sums of up to n rows in float64, and the basis's rounding: covered by the sampler.
    n = features.shape[0]
    row_error = basis.excess(1.0, 1.0 + float_error.INPUT_RELATIVE)
    error = float_error.scaled_sum(1.0, terms=n, magnitude=float(n)) + row_error
    Z = basis.project(features).double()  # float64, norm ≤ 1 (a contraction), up to ``error``
    groups = torch.as_tensor(data.labels, device=ctx.device)
    k = len(data.classes)
    steps = kmeans_steps(params.clusters_per_class, params.kmeans_refine)
    # The accountant's rule (none without k-means steps), so the noise drawn is the noise charged.
    adapt_steps = accounting.kip_steps(params.model_dump())
    total = steps + adapt_steps + 1
    fourier = None
    kmeans_error = error
    if params.feature_map == "rff":
        # Public frequencies from the release's generator (no data read).
        fourier = FourierFeatures.draw(
            Z.shape[1], params.rff_frequencies, params.rbf_width, ctx.generator, ctx.device
        )
        kmeans_error = fourier.sum_error(row_error, terms=n)

    def progress(done: int, _total: int) -> None:
        ctx.report(done, total, "dp k-means")

    centres = dp_kmeans(
        Z,
        groups,
        k,
        clusters=params.clusters_per_class,
        refine=params.kmeans_refine,
        # No k-means steps (one cluster per class): no k-means noise is declared or drawn.
        noise=StepNoise(ctx.sigma("kmeans_sums"), ctx.sigma("kmeans_counts"))
        if steps
        else StepNoise(math.inf, math.inf),
        sampler=ctx.sampler,
        generator=ctx.generator,
        error=kmeans_error,
        drop_below=params.drop_below,
        chunk=ASSIGN_CHUNK,
        progress=progress,
        features=fourier,
    )
    if adapt_steps:
        settings = dpkip.KIPSettings(
            steps=adapt_steps,
            batch=params.dpkip_batch,
            clip=params.dpkip_clip,
            lr=params.dpkip_lr,
            ridge=params.dpkip_ridge,
            width=params.rbf_width,
            noise_multiplier=ctx.sigma("kip"),
        )
        adapted = dpkip.adapt(
            Z,
            groups,
            k,
            centres.points,
            centres.groups,
            settings,
            sampler=ctx.sampler,
            generator=ctx.generator,
            progress=lambda done, _: ctx.report(steps + done, total, "dp-kip"),
        )
        centres = Centres(adapted, centres.groups)
    final = StepNoise(ctx.sigma("sums"), ctx.sigma("counts"))
    sums, counts = step(
        Z,
        groups,
        centres,
        final,
        ctx.sampler,
        error=error,
        chunk=ASSIGN_CHUNK,
        features=fourier,
        sum_features=False,
    )
    ctx.report(total, total, "cluster means")
    # Everything below reads the noisy sums and counts and public facts only.
    threshold = drop_threshold(params.drop_below, final.counts)
    kept, kept_counts = survivors(
        centres, sums, counts, drop_below=params.drop_below, sigma_counts=final.counts
    )
    means = basis.lift(kept.points, torch.float64)
    means = to_domain(means)
    classes = kept.groups.cpu().numpy()
    repeats = row_repeats(params.n_samples, kept_counts.cpu().numpy())
    rows = int(repeats.sum())
    jitter = None
    if params.spread > 0:
        jitter = Jitter(params.spread / math.sqrt(means.shape[1]), ctx.generator)
    return ReleaseOutput(
        rows=rows,
        feature_names=list(data.feature_names),
        chunks=cluster_rows(means.float(), classes, repeats, k, jitter),
        preprocessing={
            **UNIT_SCALE,
            "basis": basis.description,
            "labels": "each cluster's class, exact (clusters are formed within classes)",
            "clusters": f"{len(classes)} kept of {len(centres)} after {steps} DP k-means steps "
            + (
                f"on {2 * params.rff_frequencies} random Fourier features (rbf width "
                f"{params.rbf_width:g}) "
                if fourier is not None
                else ""
            )
            + (f"and {adapt_steps} DP-KIP steps " if adapt_steps else "")
            + f"(at most {params.clusters_per_class} per class); a cluster is kept when its noisy "
            f"count is at least {threshold:.4g}; the others of a class are pooled into one, "
            "kept when its pooled noisy count clears the threshold at its pooled noise",
            "rows": (
                "one per kept cluster"
                if params.n_samples is None
                else "kept clusters' means repeated in proportion to their noisy counts"
            )
            + (
                f", each plus N(0, ({params.spread:g}/√d)²) jitter per feature, clipped to "
                "[0, 1] and norm ≤ 1"
                if params.spread > 0
                else ""
            ),
        },
        progress="own",
        transform=transform,
    )


def preprocess_test(metadata: Any, extra: Any, X: np.ndarray) -> np.ndarray:
    """Real records into a release's space: [0, 1]^D for variant paper, unit scale (rows of
    norm ≤ 1) for variant dp."""
    lo = np.asarray(metadata["feature_range"]["lo"])
    hi = np.asarray(metadata["feature_range"]["hi"])
    if metadata["params"].get("variant", "dp") == "paper":
        return scale_to_unit(X, lo, hi)
    return unit_features(X, lo, hi)
