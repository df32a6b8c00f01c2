"""ClustMix's released rows, shared by both variants: each cluster's mean repeated (in
proportion to its weight when ``n_samples`` is set), labelled with its class, in chunks; or
(model gaussian) rows drawn from the clusters' Gaussians, mapped back to the domain chunk by
chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dpcore.mechanisms.apportion import apportion
from dpcore.mechanisms.secure_random import SecureRandom

# Released rows per chunk.
ROW_CHUNK = 8192


def row_repeats(n_samples: int | None, weights: np.ndarray) -> np.ndarray:
    """How often each cluster's row is released: once each (``n_samples`` None), or
    ``n_samples`` rows in proportion to ``weights`` (none without clusters)."""
    if n_samples is None:
        return np.ones(len(weights), dtype=np.int64)
    if not len(weights):
        return np.zeros(0, dtype=np.int64)
    return apportion(weights, n_samples)


def to_domain(rows: torch.Tensor) -> torch.Tensor:
    """Rows back in the public domain: features in [0, 1], then rows of norm ≤ 1."""
    rows = rows.clamp(0.0, 1.0)
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1.0)


@dataclass(frozen=True)
class Jitter:
    """Data-independent Gaussian jitter of each released row (post-processing: drawn from
    the release's secure source without reading anything private)."""

    std: float
    generator: SecureRandom

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        noise = self.generator.normal(tuple(rows.shape), device=rows.device, dtype=rows.dtype)
        return to_domain(rows + self.std * noise)


def cluster_rows(
    means: torch.Tensor,
    classes: np.ndarray,
    repeats: np.ndarray,
    n_classes: int,
    jitter: Jitter | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The released rows in chunks of ``ROW_CHUNK`` (memory bounded whatever n_samples)."""
    if not len(classes) or repeats.sum() == 0:
        return
    index_all = np.repeat(np.arange(len(classes)), repeats)
    cluster_class = torch.as_tensor(classes, device=means.device)
    for start in range(0, len(index_all), ROW_CHUNK):
        index = torch.as_tensor(index_all[start : start + ROW_CHUNK], device=means.device)
        labels = cluster_class[index]
        onehot = torch.zeros((len(index), n_classes), dtype=means.dtype, device=means.device)
        onehot[torch.arange(len(index), device=means.device), labels] = 1
        rows = means[index]
        yield (rows if jitter is None else jitter(rows)), onehot


def sampled_rows(
    coefficients: torch.Tensor,
    classes: torch.Tensor,
    decode: Callable[[torch.Tensor], torch.Tensor],
    n_classes: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Rows drawn in the basis (n, k), ``decode``d to the domain ``ROW_CHUNK`` at a time (memory
    bounded by the chunk, whatever d), with their classes one-hot."""
    for start in range(0, coefficients.shape[0], ROW_CHUNK):
        rows = decode(coefficients[start : start + ROW_CHUNK])
        labels = classes[start : start + ROW_CHUNK].to(rows.device)
        onehot = torch.zeros((len(labels), n_classes), dtype=rows.dtype, device=rows.device)
        onehot[torch.arange(len(labels), device=rows.device), labels] = 1
        yield rows, onehot
