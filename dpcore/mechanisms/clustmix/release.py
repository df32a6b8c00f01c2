"""A ClustMix release job. Variant ``dp``: unit-scale preprocessing, a public basis, DP k-means
per class (``dpcore.mechanisms.kmeans``), then one more noisy step on the final clusters; each
released row is a kept cluster's noisy sum over its noisy count, mapped back from the basis —
or, with model gaussian, the final step also noises every cluster's second-moment sums
(``dpcore.mechanisms.moments``) and the released rows are drawn from the clusters' Gaussians
(post-processing). Variant ``paper``: ``paper.release`` (Algorithm 2 of the paper)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpcore.mechanisms import detail, float_error, moments, values
from dpcore.mechanisms.basis import Basis, basis_for
from dpcore.mechanisms.clustmix import accounting, dpkip, paper
from dpcore.mechanisms.clustmix.params import ClustMixParams
from dpcore.mechanisms.clustmix.rows import (
    Jitter,
    cluster_rows,
    row_repeats,
    sampled_rows,
    to_domain,
)
from dpcore.mechanisms.contract import UNIT_SCALE, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.kmeans import (
    Centres,
    FourierFeatures,
    StepNoise,
    assign,
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
# Model gaussian: h, the basis coordinates whose covariance is modelled, when moment_dim is
# not given (at most the basis dimension); the MNIST study's choice (docs/results/
# moment_model.md). Records per chunk of the second moments (memory ≈ chunk·h²·16 bytes).
MOMENT_DIM = 128
MOMENT_CHUNK = 1024
# Values matched: rows drawn from the fitted model (post-processing) whose values give the
# sampled-value distribution that the map reads ranks from.
VALUE_REFERENCE_ROWS = 2000


def moment_dim(params: ClustMixParams, basis_dim: int) -> int:
    """h of a gaussian release: ``moment_dim`` (admission checked it fits), or
    min(``MOMENT_DIM``, the basis dimension)."""
    if params.moment_dim is not None:
        if params.moment_dim > basis_dim:
            raise ValueError(f"moment_dim {params.moment_dim} exceeds the basis's {basis_dim}")
        return params.moment_dim
    return min(MOMENT_DIM, basis_dim)


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
    clusters_note = (
        f"after {steps} DP k-means steps "
        + (
            f"on {2 * params.rff_frequencies} random Fourier features (rbf width "
            f"{params.rbf_width:g}) "
            if fourier is not None
            else ""
        )
        + (f"and {adapt_steps} DP-KIP steps " if adapt_steps else "")
        + f"(at most {params.clusters_per_class} per class)"
    )
    if params.model == "gaussian":
        assignment = assign(Z, groups, centres, chunk=ASSIGN_CHUNK, features=fourier)
        gaussian = _gaussian_rows(
            params,
            data,
            features,
            Z,
            assignment,
            centres.groups,
            basis,
            ctx,
            n_classes=k,
            row_error=row_error,
            total=total,
        )
        return ReleaseOutput(
            rows=gaussian.rows,
            feature_names=list(data.feature_names),
            chunks=gaussian.chunks,
            preprocessing={
                **UNIT_SCALE,
                "basis": basis.description,
                "labels": "each cluster's class, exact (clusters are formed within classes)",
                "clusters": f"{gaussian.kept} kept of {len(centres)} {clusters_note}; "
                + _kept_rule(gaussian.threshold),
                "rows": gaussian.description,
            },
            progress="own",
            transform=transform,
        )
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
            "clusters": f"{len(classes)} kept of {len(centres)} {clusters_note}; "
            + _kept_rule(threshold),
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


def _kept_rule(threshold: float) -> str:
    return (
        f"a cluster is kept when its noisy count is at least {threshold:.4g}; the others of a "
        "class are pooled into one, kept when its pooled noisy count clears the threshold at "
        "its pooled noise"
    )


@dataclass(frozen=True)
class _Sampled:
    """A gaussian release's rows (lazy chunks) and what to say about them."""

    rows: int
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]]
    kept: int
    threshold: float
    description: str


def _gaussian_rows(
    params: ClustMixParams,
    data: PrivateData,
    features: torch.Tensor,
    Z: torch.Tensor,
    assignment: torch.Tensor,
    cluster_groups: torch.Tensor,
    basis: Basis,
    ctx: RunContext,
    *,
    n_classes: int,
    row_error: float,
    total: int,
) -> _Sampled:
    """Model gaussian's final step: every cluster's noisy count, sum and second-moment sums
    (``moments.noisy_moments``, at the declared scales), then post-processing only — the
    small clusters pooled, a Gaussian fitted per kept cluster, n_samples (default n) rows
    drawn from the release's secure source, mapped back to the domain (values matched: the
    noisy value histogram is released in the same step, and every value mapped onto it)."""
    n, k = Z.shape
    h = moment_dim(params, k)
    scales = moments.Scales(
        counts=ctx.sigma("counts"), sums=ctx.sigma("sums"), second=ctx.sigma("second")
    )
    stats = moments.noisy_moments(
        Z,
        assignment,
        cluster_groups,
        second_dim=h,
        scales=scales,
        sampler=ctx.sampler,
        # Sums of up to n float32-stored rows in float64, the basis's rounding, the products.
        errors=moments.step_errors(row_error, n, stored=float_error.INPUT_RELATIVE),
        chunk=MOMENT_CHUNK,
    )
    noisy_values = None
    if params.values == "matched":
        noisy_values = ctx.sampler(
            values.histogram(torch.as_tensor(scale_to_unit(data.X, data.lo, data.hi))),
            sigma=ctx.sigma("values"),
            sensitivity=values.SENSITIVITY,
            error=values.rounding_error(n),
        )[0]
    outside = None
    if params.detail == "outside":
        noisy_energy = ctx.sampler(
            detail.total(features, Z),
            sigma=ctx.sigma("detail"),
            sensitivity=detail.SENSITIVITY,
            error=detail.rounding_error(n),
        )
        outside = detail.Detail(float(noisy_energy[0, 0]), n, basis)
    # Everything below reads the noisy statistics and public facts only (the rows drawn per
    # cluster follow its noisy count).
    ctx.report(total, total, "sampling")
    threshold = drop_threshold(params.drop_below, scales.counts)
    kept = moments.survivors(
        stats, drop_below=params.drop_below, sigma_counts=scales.counts, pad_lost_groups=True
    )
    fitted = moments.fit(kept, scales, moments.FitOptions())
    wanted = params.n_samples if params.n_samples is not None else n
    coefficients, classes = moments.sample(fitted, wanted, ctx.generator, h)
    clip = params.clip_norm
    lift_detail = None if outside is None else (lambda x: outside(x, ctx.generator))
    value_map = None
    blend = (
        params.value_blend
        if params.value_blend is not None
        else values.automatic_blend(fitted.shrink_weights)
    )
    if noisy_values is not None:
        # F_s from a reference draw of the fitted model (no data read).
        reference, _ = moments.sample(fitted, VALUE_REFERENCE_ROWS, ctx.generator, h)
        value_map = values.ValueMap(
            noisy_values, n, moments.decode(reference, basis, clip, detail=lift_detail), blend=blend
        )

    def decode(chunk: torch.Tensor) -> torch.Tensor:
        # C·Bz clipped to [0, 1] (the declared bounds), back to unit scale (÷ C), rows of
        # norm ≤ 1 as the real records' (to_raw maps [0, 1/C] onto [lo, hi]); matched values
        # keep the data's levels instead (in [0, 1], any norm).
        x01 = moments.decode(chunk, basis, clip, detail=lift_detail)
        if value_map is not None:
            return (value_map(x01) / clip).float()
        unit = x01 / clip
        return (unit / unit.norm(dim=1, keepdim=True).clamp_min(1.0)).float()

    described = (
        "; each value then mapped onto the noisy histogram of the records' values (its rank "
        f"among a reference draw of {VALUE_REFERENCE_ROWS} model rows, read off the histogram's "
        f"isotonic distribution as one of {values.BINS} levels of the declared range"
        + (
            f", blended {blend:.3g} with the model value"
            + (
                " (w = clamp(2·(1 − mean shrinkage weight), ½, 1))"
                if params.value_blend is None
                else ""
            )
            if blend < 1
            else ""
        )
        + ")"
        if value_map is not None
        else ""
    )
    detail_note = (
        ""
        if outside is None
        else ", given isotropic Gaussian detail in the directions the basis leaves out (mean "
        f"energy {outside.energy:.4g} of a unit row: the records' noisy summed energy there "
        "over n)"
    )
    return _Sampled(
        int(coefficients.shape[0]),
        sampled_rows(coefficients, classes, decode, n_classes),
        int(kept.counts.shape[0]),
        threshold,
        f"{wanted if coefficients.shape[0] else 0} rows drawn from the kept clusters' Gaussians "
        "in proportion to their noisy counts (largest remainders), from the release's secure "
        f"source: mean the noisy sum over the noisy count; covariance over the first {h} basis "
        "coordinates the noisy second-moment sums over the noisy count less the mean's outer "
        "product, shrunk toward its diagonal (whose variances are shrunk toward all clusters' "
        "count-weighted ones) by "
        "weights computed from the noise scales and the noisy count, eigenvalues floored at "
        "1e-6; the other coordinates at the mean; a class none of whose clusters is kept is "
        f"drawn all the same, its statistics padded with {threshold:.4g} pseudo-records at all "
        "records' noisy mean and second moment; "
        "mapped back from the basis"
        + detail_note
        + ", clipped to [0, 1]"
        + (described if described else " and to norm ≤ 1")
        + " (post-processing)",
    )


def preprocess_test(metadata: Any, extra: Any, X: np.ndarray) -> np.ndarray:
    """Real records into a release's space: [0, 1]^D for variant paper, unit scale (rows of
    norm ≤ 1) for variant dp, and [0, 1/C]^D (no row clipping, as the released rows) with
    values matched."""
    lo = np.asarray(metadata["feature_range"]["lo"])
    hi = np.asarray(metadata["feature_range"]["hi"])
    params = metadata["params"]
    if params.get("variant", "dp") == "paper":
        return scale_to_unit(X, lo, hi)
    if params.get("model") == "gaussian" and params.get("values") == "matched":
        return scale_to_unit(X, lo, hi) / float(params["clip_norm"])
    return unit_features(X, lo, hi)
