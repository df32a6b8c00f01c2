"""A DP-CDA release job: standardise (declared, DP or unit range), clip, then per-class
mixtures."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis, basis_for
from dpcore.mechanisms.class_mixing import mixture_sensitivity, per_class
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.dpcda.accounting_counts import (
    COUNT_SENSITIVITY,
    bound_margin,
    lower_bounds,
)
from dpcore.mechanisms.dpcda.accounting_mixing import nonnegative_features, statistics_step
from dpcore.mechanisms.dpcda.generate import generate
from dpcore.mechanisms.dpcda.params import DPCDAParams
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.noise import tail as noise_tail
from dpcore.mechanisms.postprocess import postprocessor
from dpcore.mechanisms.sampling import chunk_size
from dpcore.preprocessing import RowTransform, clip_rows_l2, scale_to_unit, standardise

_FEATURES = {
    "declared": "clip to the declared feature_range, z-score with the owner's declared "
    "(public) feature_mean/feature_std",
    "dp": "clip to the declared feature_range, scale to [0, 1], z-score with means and "
    "stds estimated under DP (published here, charged with the release)",
    "unit_range": "clip to the declared feature_range, scale to [0, 1]",
}
_STATISTICS = {
    "declared": "declared public by the owner",
    "dp": "estimated under differential privacy, cost included in the charge",
    "unit_range": "none",
}


def dp_statistics(
    unit: np.ndarray, stats_noise: float, noise: NoiseSampler
) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std of [0, 1]-scaled features from Gaussian-noised sums and sums
    of squares (together they move by at most √(2d) when one record is replaced; n is
    public).

    Rounding, covered by the sampler: the computed u and fl(u²) lie in [0, 1] (subtraction,
    division and squaring round monotonically, and u = 1 at the upper bound exactly), so the
    sensitivity holds for them as computed; the float64 sums of n such rows (each of norm
    ≤ √(2d)) are each off by at most γ_{n+1}·n·√(2d) in L2 (``float_error.scaled_sum``)."""
    n, d = unit.shape
    exact = torch.as_tensor(np.concatenate([unit.sum(axis=0), (unit**2).sum(axis=0)])[None, :])
    step = statistics_step(stats_noise=stats_noise, n_features=d)
    sensitivity = step.scale.sensitivity
    error = float_error.scaled_sum(sensitivity, terms=n, magnitude=n * sensitivity)
    noisy = noise(exact, sigma=step.scale.sigma, sensitivity=sensitivity, error=error).numpy()[0]
    sums, squares = noisy[:d], noisy[d:]
    mean = np.clip(sums / n, 0.0, 1.0)
    var = squares / n - mean**2
    # A floor keeps the z-score finite for constant (or noise-dominated) features.
    std = np.sqrt(np.clip(var, 1e-4, 0.25))
    return mean, std


# k of the default basis on image-shaped data: the MNIST sweet-spot study (docs/results).
BASIS_DIM = 256


def release(params: DPCDAParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    mode = params.standardization
    published: dict[str, Any] = {}
    lo, hi = np.asarray(data.lo, dtype=np.float64), np.asarray(data.hi, dtype=np.float64)
    # Every mode is one public affine map of the clipped record, then the clip to C; the
    # release maps back through it (raw units). C is an accountant key here (√2·C/ℓ or 2C/ℓ),
    # so rows are not divided by it.
    if mode == "declared":
        assert params.feature_mean is not None and params.feature_std is not None
        std = np.asarray(params.feature_std, dtype=np.float64)
        if np.any(std <= 0):
            raise ValueError("declared standard deviations must be > 0")
        transform = RowTransform(
            lo, hi, np.asarray(params.feature_mean, dtype=np.float64), std, params.clip_norm
        )
    elif mode == "dp":
        assert params.stats_noise is not None
        unit = scale_to_unit(data.X, lo, hi)
        mean, std = dp_statistics(unit, params.stats_noise, ctx.sampler)
        del unit
        # DP outputs: published so analysts can standardise their own data alike.
        published = {"feature_mean": mean.tolist(), "feature_std": std.tolist(), "scale": "unit"}
        # z = (u − m)/s with u = (x − lo)/(hi − lo): shift lo + m(hi − lo), scale s(hi − lo).
        transform = RowTransform(lo, hi, lo + mean * (hi - lo), std * (hi - lo), params.clip_norm)
    else:
        transform = RowTransform.unit_range(lo, hi, params.clip_norm, divide=False)
    features = torch.as_tensor(transform.rows(data.X, np.float32), device=ctx.device)
    k = len(data.classes)
    counts = np.bincount(data.labels, minlength=k)
    class_sizes: dict[str, Any]
    if params.class_sizes == "declared":
        if counts.min() < params.min_class_size:
            raise ValueError("a class is smaller than the declared min_class_size")
        mix = True
        class_sizes = {"class_sizes": DECLARED_RESTRICTION.format(m=params.min_class_size)}
    else:
        mix, class_sizes = _dp_class_sizes(params, counts, ctx)
    nonnegative = nonnegative_features(mode)
    rows = per_class(params.n_samples, k)
    sigma = ctx.sigma("features")
    basis = basis_for(params, tuple(data.feature_shape), features.shape[1], BASIS_DIM)
    post = postprocessor(
        params.postprocess,
        sigma=sigma,
        basis=basis,
        grouped=True,  # exact labels: each class's rows are denoised together
        unit_box=mode == "unit_range",
        max_norm=params.clip_norm,
        noisy_labels=False,
        # Rows are means of ℓ records of a class: record-level spread, along the axes the
        # bulk-aware shrinker keeps (the Wiener gain would scale noise axes up).
        spread=math.sqrt(params.mixture_degree),
        shrinker="optimal",
    )
    chunks = (
        generate(
            features,
            torch.as_tensor(data.labels, device=ctx.device),
            n_classes=k,
            mixture_degree=params.mixture_degree,
            n_samples=params.n_samples,
            sigma=sigma,
            clip_norm=params.clip_norm,
            nonnegative=nonnegative,
            generator=ctx.generator,
            noise=ctx.sampler,
            basis=None if basis.identity else basis,
        )
        if mix
        else _noise_only(features, k, rows, sigma, params, nonnegative, ctx, basis)
    )
    return ReleaseOutput(
        preprocessing={
            "features": _FEATURES[mode] + f", clip rows to L2 norm <= {params.clip_norm}",
            "labels": "each mixture's class, exact (a function of the public class index)",
            "statistics": _STATISTICS[mode],
            **({"dp_statistics": published} if published else {}),
            **class_sizes,
            "basis": basis.description,
            "postprocess": post.description if post is not None else "none",
        },
        postprocess=post,
        rows=k * rows,
        feature_names=list(data.feature_names),
        chunks=chunks,
        transform=transform,
    )


DECLARED_RESTRICTION = (
    "declared: the guarantee holds over datasets whose classes all have at least {m} "
    "records (min_class_size, checked against the private counts), in both neighbours"
)


def _dp_class_sizes(
    params: DPCDAParams, counts: np.ndarray, ctx: RunContext
) -> tuple[bool, dict[str, Any]]:
    """Noisy counts and their lower bounds (``accounting_counts``); mix only when every
    bound reaches min_class_size. The decision reads the noisy counts only — except that a
    class too small to hold a mixture never mixes, which can differ only in the failure event
    the accountant charges β for."""
    # The count noise as charged: the accountant's "counts" scale (the request's count_noise,
    # or the one chosen for the target at admission and stored with the parameters). The
    # margin of the bounds must use the σ the counts were drawn with.
    count_noise = ctx.sigma("counts")
    if params.count_noise is not None and not math.isclose(
        params.count_noise, count_noise, rel_tol=1e-12
    ):
        raise ValueError(
            f"count_noise {params.count_noise} differs from the charged counts' noise {count_noise}"
        )
    # β as charged: the accountant's (chosen for the target when the request gave none).
    beta = float(ctx.noise.analysis["class_size_failure_prob"])
    exact = torch.as_tensor(counts.astype(np.float64))[None, :]
    noisy = ctx.sampler(exact, sigma=count_noise, sensitivity=COUNT_SENSITIVITY).numpy()[0]
    # The margin of the noise as drawn (the secure sampler's σ' and lattice), not σ_c's alone.
    spread, offset = noise_tail(
        ctx.sampler, sigma=count_noise, sensitivity=COUNT_SENSITIVITY, dim=len(counts)
    )
    bounds = lower_bounds(noisy, spread, beta, offset)
    reached = bool(bounds.min() >= params.min_class_size)
    mix = reached and bool(counts.min() >= params.mixture_degree)
    out: dict[str, Any] = {
        "class_sizes": "dp: noisy per-class counts (charged with the release) give lower "
        "bounds, all correct with probability >= 1 - class_size_failure_prob; mixtures "
        "only when every bound reaches min_class_size, else rows of noise alone",
        "class_size_failure_prob": beta,
        "count_noise": count_noise,
        "dp_class_counts": noisy.tolist(),
        "dp_class_size_lower_bounds": bounds.tolist(),
        "mixed": mix,
    }
    if not mix:
        # What happened, in published terms: the bounds and ``mixed`` already tell the two
        # cases apart (bounds ≥ m and not mixed: some class holds fewer than ℓ records,
        # possible only in the failure event β covers).
        out["not_mixed"] = (
            f"a DP lower bound ({int(bounds.min())}) is below min_class_size "
            f"{params.min_class_size} (the bounds sit σ'·Φ⁻¹(1 − β/K) + g = "
            f"{bound_margin(spread, beta, len(counts)) + offset:.4g} below the noisy "
            "counts): every row is noise alone, with no record in it, charged as a mixed "
            "release. A smaller min_class_size, a larger ε (a smaller default count_noise) or "
            "an explicit smaller count_noise (charged more) lets such a dataset mix"
            if not reached
            else "a class holds fewer than mixture_degree records: every row is noise alone, "
            "with no record in it, charged as a mixed release"
        )
    return mix, out


def _noise_only(
    features: torch.Tensor,
    k: int,
    rows: int,
    sigma: float,
    params: DPCDAParams,
    nonnegative: bool,
    ctx: RunContext,
    basis: Basis,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """⊥: the release's shapes and noise with no record in them (a DP lower bound fell
    below min_class_size)."""
    sensitivity = mixture_sensitivity(
        clip_norm=params.clip_norm, mixture_degree=params.mixture_degree, nonnegative=nonnegative
    )
    # Noise in the basis's coordinates, as a mixed release would have it.
    dim = features.shape[1] if basis.matrix is None else basis.matrix.shape[1]
    step = chunk_size(mixture_degree=1, dim=dim, n=features.shape[0])
    for c in range(k):
        for start in range(0, rows, step):
            count = min(step, rows - start)
            zeros = torch.zeros((count, dim), device=ctx.device, dtype=torch.float64)
            onehot = torch.zeros((count, k), device=ctx.device, dtype=features.dtype)
            onehot[:, c] = 1
            noisy = ctx.sampler(zeros, sigma=sigma, sensitivity=sensitivity)
            yield basis.lift(noisy, features.dtype), onehot


def preprocess_test(metadata: Any, extra: Any, X: np.ndarray) -> np.ndarray:
    """Real records into a DP-CDA release's space: its standardisation (declared, or the
    published DP statistics, or the unit range), then its clip."""
    params = metadata["params"]
    lo = np.asarray(metadata["feature_range"]["lo"])
    hi = np.asarray(metadata["feature_range"]["hi"])
    mode = params.get("standardization")
    if mode == "declared":
        X = standardise(np.clip(X, lo, hi), params["feature_mean"], params["feature_std"])
    elif mode == "dp":
        stats = metadata["preprocessing"]["dp_statistics"]
        X = standardise(scale_to_unit(X, lo, hi), stats["feature_mean"], stats["feature_std"])
    else:
        X = scale_to_unit(X, lo, hi)
    return clip_rows_l2(X, float(params.get("clip_norm", 1.0)))
