"""A random-projection release job: unit-scale preprocessing, a data-independent projection
(shipped in the NPZ), every record noised once."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.random_projection.generate import random_projection
from dpcore.mechanisms.random_projection.params import RandomProjectionParams
from dpcore.preprocessing import RowTransform, unit_features


def release(params: RandomProjectionParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    # Projections are not in the dataset's feature space: values stay as made (mechanism).
    transform = unit_transform(data, params.clip_norm, output="mechanism")
    features, labels = unit_scale(data, ctx.device, transform)
    matrix, chunks = random_projection(
        features,
        labels,
        projection_dim=params.projection_dim,
        spectral_norm=params.spectral_norm,
        sigma_x=ctx.sigma("features"),
        sigma_y=ctx.sigma("labels"),
        generator=ctx.generator,
        noise=ctx.sampler,
    )
    return ReleaseOutput(
        rows=data.n_rows,
        feature_names=[f"p{i}" for i in range(params.projection_dim)],
        chunks=chunks,
        extra={"projection": matrix.cpu().numpy()},
        transform=transform,
    )


def preprocess_test(metadata: Any, extra: Any, X: np.ndarray) -> np.ndarray:
    """Real records into the release's space: unit scale, then the published projection
    (only NPZ releases carry it)."""
    if "projection" not in extra:
        raise ValueError("a random-projection release needs its projection: use the NPZ format")
    projection = np.asarray(extra["projection"]).T
    if "transform" in metadata:
        return np.asarray(RowTransform.from_metadata(metadata["transform"]).rows(X) @ projection)
    # A release made before the row transform: rows were clipped to norm 1.
    lo = np.asarray(metadata["feature_range"]["lo"])
    hi = np.asarray(metadata["feature_range"]["hi"])
    return np.asarray(unit_features(X, lo, hi) @ projection)
