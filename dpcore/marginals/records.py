"""Drawn records out of a marginal-based release: the post-processing generator and the
chunks the worker's row chain takes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from dpcore.marginals.discretise import Discretised, decode
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import one_hot

CHUNK_ROWS = 1 << 16


def post_rng(generator: SecureRandom) -> np.random.Generator:
    """Post-processing randomness (bins, merged values, record draws), seeded from the
    release's secure source."""
    return np.random.default_rng([int(w) for w in generator.words(4)])


def chunks(
    unit: np.ndarray, labels: np.ndarray, classes: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Records (features in [0, 1], class indices) as (features, one-hot labels) chunks."""
    for start in range(0, len(unit), CHUNK_ROWS):
        stop = min(len(unit), start + CHUNK_ROWS)
        x = torch.as_tensor(unit[start:stop], dtype=torch.float32, device=device)
        y = torch.as_tensor(
            one_hot(labels[start:stop], classes), dtype=torch.float32, device=device
        )
        yield x, y


def output(
    drawn: np.ndarray,
    prepared: Discretised,
    data: PrivateData,
    bins: int,
    rng: np.random.Generator,
    device: torch.device,
    *,
    statistics: str,
    fit: str,
) -> ReleaseOutput:
    """Drawn attribute values as the release: values decoded within their bins, in raw units,
    with what the marginal-based mechanisms' metadata says of them (``statistics``: what was
    measured; ``fit``: how the model was fitted)."""
    unit, labels = decode(drawn, prepared.attributes, data.X.shape[1], rng)
    return ReleaseOutput(
        rows=len(drawn),
        feature_names=list(data.feature_names),
        chunks=chunks(unit, labels, len(data.classes), device),
        preprocessing={
            "features": f"each numeric column's declared [lo, hi] cut into {bins} "
            "equal-width bins, each missing-value indicator and categorical column and the "
            "label one attribute each (public rules); released values drawn uniformly within "
            "their bin, in raw units",
            "labels": "each row's class, drawn with its features from the model (exact)",
            "statistics": statistics,
            "rows": f"drawn from the graphical model fitted to the noisy histograms ({fit}): "
            "post-processing",
        },
        progress="own",
        transform=prepared.transform,
    )
