"""A DP-CDA release job: standardise (declared, DP or unit range), clip, then per-class
mixtures."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpcore.mechanisms.dpcda.accounting import nonnegative_features, statistics_step
from dpcore.mechanisms.dpcda.generate import generate, per_class
from dpcore.mechanisms.dpcda.params import DPCDAParams
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.spec import PrivateData, ReleaseOutput, RunContext
from dpcore.preprocessing import clip_rows_l2, scale_to_unit, standardise

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
    public)."""
    n, d = unit.shape
    exact = torch.as_tensor(np.concatenate([unit.sum(axis=0), (unit**2).sum(axis=0)])[None, :])
    step = statistics_step(stats_noise=stats_noise, n_features=d)
    noisy = noise(exact, sigma=step.scale.sigma, sensitivity=step.scale.sensitivity).numpy()[0]
    sums, squares = noisy[:d], noisy[d:]
    mean = np.clip(sums / n, 0.0, 1.0)
    var = squares / n - mean**2
    # A floor keeps the z-score finite for constant (or noise-dominated) features.
    std = np.sqrt(np.clip(var, 1e-4, 0.25))
    return mean, std


def release(params: DPCDAParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    mode = params.standardization
    published: dict[str, Any] = {}
    if mode == "declared":
        assert params.feature_mean is not None and params.feature_std is not None
        X = standardise(
            np.clip(data.X, data.lo, data.hi),
            np.asarray(params.feature_mean),
            np.asarray(params.feature_std),
        )
    elif mode == "dp":
        assert params.stats_noise is not None
        unit = scale_to_unit(data.X, data.lo, data.hi)
        mean, std = dp_statistics(unit, params.stats_noise, ctx.sampler)
        X = standardise(unit, mean, std)
        # DP outputs: published so analysts can standardise their own data alike.
        published = {"feature_mean": mean.tolist(), "feature_std": std.tolist(), "scale": "unit"}
    else:
        X = scale_to_unit(data.X, data.lo, data.hi)
    features = torch.as_tensor(
        clip_rows_l2(X, params.clip_norm), dtype=torch.float32, device=ctx.device
    )
    k = len(data.classes)
    counts = np.bincount(data.labels, minlength=k)
    if counts.min() < params.min_class_size:
        raise ValueError("a class is smaller than the declared min_class_size")
    return ReleaseOutput(
        preprocessing={
            "features": _FEATURES[mode] + f", clip rows to L2 norm <= {params.clip_norm}",
            "labels": "each mixture's class, exact (a function of the public class index)",
            "statistics": _STATISTICS[mode],
            **({"dp_statistics": published} if published else {}),
        },
        rows=k * per_class(params.n_samples, k),
        feature_names=list(data.feature_names),
        chunks=generate(
            features,
            torch.as_tensor(data.labels, device=ctx.device),
            n_classes=k,
            mixture_degree=params.mixture_degree,
            n_samples=params.n_samples,
            sigma=ctx.sigma("features"),
            clip_norm=params.clip_norm,
            nonnegative=nonnegative_features(mode),
            generator=ctx.generator,
            noise=ctx.sampler,
        ),
    )


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
