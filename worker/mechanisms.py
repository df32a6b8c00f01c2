"""What a release job runs, per mechanism: public-facts preprocessing, then the generator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpcore.accounting import sgdrm as sgdrm_accountant
from dpcore.mechanisms import baselines, dpcda, dpmix, sgdrm
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.preprocessing import clip_rows_l2, one_hot, scale_to_unit, standardise, unit_features
from service.datasets.parsing import ParsedDataset

Chunks = Iterator[tuple[torch.Tensor, torch.Tensor]]


UNIT_SCALE: dict[str, Any] = {
    "features": "clip to the declared feature_range, scale to [0, 1], scale rows to L2 norm <= 1",
    "labels": "one-hot over the declared classes",
    "statistics": "none computed from the data",
}


@dataclass
class MechanismOutput:
    rows: int
    feature_names: list[str]
    chunks: Chunks
    # Data-independent arrays that travel with an NPZ release (e.g. a projection matrix).
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    preprocessing: dict[str, Any] = field(default_factory=lambda: dict(UNIT_SCALE))


def _unit_scale(parsed: ParsedDataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features in [0, 1] with L2 norm ≤ 1 and one-hot labels: what the accountants assume."""
    features = unit_features(parsed.X, parsed.lo, parsed.hi)
    labels = one_hot(parsed.labels, len(parsed.classes))
    return (
        torch.as_tensor(features, dtype=torch.float32, device=device),
        torch.as_tensor(labels, dtype=torch.float32, device=device),
    )


def dp_statistics(
    unit: np.ndarray, stats_noise: float, noise: NoiseSampler
) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std of [0, 1]-scaled features from Gaussian-noised sums and sums
    of squares (together they move by at most √(2d) when one record is replaced; n is
    public)."""
    n, d = unit.shape
    exact = torch.as_tensor(np.concatenate([unit.sum(axis=0), (unit**2).sum(axis=0)])[None, :])
    noisy = noise(exact, sigma=stats_noise, sensitivity=float(np.sqrt(2 * d))).numpy()[0]
    sums, squares = noisy[:d], noisy[d:]
    mean = np.clip(sums / n, 0.0, 1.0)
    var = squares / n - mean**2
    # A floor keeps the z-score finite for constant (or noise-dominated) features.
    std = np.sqrt(np.clip(var, 1e-4, 0.25))
    return mean, std


def _dpcda(
    params: dict[str, Any],
    parsed: ParsedDataset,
    *,
    sigma: float,
    generator: torch.Generator,
    noise: NoiseSampler,
    device: torch.device,
) -> MechanismOutput:
    mode = params.get("standardization", "unit_range")
    published: dict[str, Any] = {}
    if mode == "declared":
        X = standardise(
            np.clip(parsed.X, parsed.lo, parsed.hi),
            np.asarray(params["feature_mean"]),
            np.asarray(params["feature_std"]),
        )
    elif mode == "dp":
        unit = scale_to_unit(parsed.X, parsed.lo, parsed.hi)
        mean, std = dp_statistics(unit, float(params["stats_noise"]), noise)
        X = standardise(unit, mean, std)
        # DP outputs: published so analysts can standardise their own data alike.
        published = {"feature_mean": mean.tolist(), "feature_std": std.tolist(), "scale": "unit"}
    else:
        X = scale_to_unit(parsed.X, parsed.lo, parsed.hi)
    clip_norm = float(params.get("clip_norm", 1.0))
    features = torch.as_tensor(clip_rows_l2(X, clip_norm), dtype=torch.float32, device=device)
    k = len(parsed.classes)
    counts = np.bincount(parsed.labels, minlength=k)
    if counts.min() < int(params["min_class_size"]):
        raise ValueError("a class is smaller than the declared min_class_size")
    features_text = {
        "declared": "clip to the declared feature_range, z-score with the owner's declared "
        "(public) feature_mean/feature_std",
        "dp": "clip to the declared feature_range, scale to [0, 1], z-score with means and "
        "stds estimated under DP (published here, charged with the release)",
        "unit_range": "clip to the declared feature_range, scale to [0, 1]",
    }[mode]
    statistics = {
        "declared": "declared public by the owner",
        "dp": "estimated under differential privacy, cost included in the charge",
        "unit_range": "none",
    }[mode]
    return MechanismOutput(
        preprocessing={
            "features": features_text
            + f", clip rows to L2 norm <= {float(params.get('clip_norm', 1.0))}",
            "labels": "each mixture's class, exact (a function of the public class index)",
            "statistics": statistics,
            **({"dp_statistics": published} if published else {}),
        },
        rows=k * dpcda.per_class(int(params["n_samples"]), k),
        feature_names=list(parsed.feature_names),
        chunks=dpcda.generate(
            features,
            torch.as_tensor(parsed.labels, device=device),
            n_classes=k,
            mixture_degree=int(params["mixture_degree"]),
            n_samples=int(params["n_samples"]),
            sigma=sigma,
            clip_norm=clip_norm,
            generator=generator,
            noise=noise,
        ),
    )


def build(
    mechanism: str,
    params: dict[str, Any],
    parsed: ParsedDataset,
    *,
    sigma_x: float,
    sigma_y: float,
    generator: torch.Generator,
    noise: NoiseSampler,
    device: torch.device,
) -> MechanismOutput:
    """``generator`` draws the mechanism's sampling; ``noise`` adds its noise."""
    if mechanism == "dpcda":
        return _dpcda(
            params, parsed, sigma=sigma_x, generator=generator, noise=noise, device=device
        )
    features, labels = _unit_scale(parsed, device)
    mixing = {"sigma_x": sigma_x, "sigma_y": sigma_y, "generator": generator, "noise": noise}
    if mechanism == "dpmix":
        generate = (
            dpmix.generate_by_record if params.get("assignment") == "record" else dpmix.generate
        )
        return MechanismOutput(
            rows=int(params["n_samples"]),
            feature_names=list(parsed.feature_names),
            chunks=generate(
                features,
                labels,
                mixture_degree=int(params["mixture_degree"]),
                n_samples=int(params["n_samples"]),
                **mixing,  # type: ignore[arg-type]
            ),
        )
    if mechanism == "sgdrm":
        if sigma_x != sigma_y:
            raise ValueError("sgdrm adds one noise level to features and labels")
        width = int(params["mixture_width"])
        bound = params.get("coefficient_bound") or sgdrm_accountant.default_coefficient_bound(width)
        return MechanismOutput(
            rows=int(params["n_samples"]),
            feature_names=list(parsed.feature_names),
            chunks=sgdrm.generate(
                features,
                labels,
                mixture_width=width,
                n_samples=int(params["n_samples"]),
                coefficient_bound=float(bound),
                clip=params.get("coefficients", "clipped") == "clipped",
                sigma=sigma_x,
                generator=generator,
                noise=noise,
            ),
        )
    baseline = {"sigma_x": sigma_x, "sigma_y": sigma_y, "generator": generator, "noise": noise}
    if mechanism == "local_perturbation":
        return MechanismOutput(
            rows=parsed.n_rows,
            feature_names=list(parsed.feature_names),
            chunks=baselines.local_perturbation(features, labels, **baseline),  # type: ignore[arg-type]
        )
    if mechanism == "random_projection":
        dim = int(params["projection_dim"])
        matrix, chunks = baselines.random_projection(
            features,
            labels,
            projection_dim=dim,
            spectral_norm=float(params.get("spectral_norm", 1.0)),
            **baseline,  # type: ignore[arg-type]
        )
        return MechanismOutput(
            rows=parsed.n_rows,
            feature_names=[f"p{i}" for i in range(dim)],
            chunks=chunks,
            extra={"projection": matrix.cpu().numpy()},
        )
    raise ValueError(f"unknown mechanism {mechanism!r}")
