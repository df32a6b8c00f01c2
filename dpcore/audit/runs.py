"""The real mechanism runs of an audit: ``trials`` releases of D and of D′, through the
dpcore function the worker calls (possibly wrapped by a test seam), and helpers they share.

Batched where that is the same distribution: when a mechanism's rows are i.i.d. given the
data, one call with T·trials rows is trials independent releases; when every record is
released on its own, one call on D and D′ stacked trials times each is trials releases of each
(sharing any data-independent matrix: the audit is conditional on it, as the accountant's
proof is). A mechanism whose rows are coupled runs once per trial.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom


@dataclass(frozen=True)
class Release:
    """``trials`` releases of one dataset: features (trials, rows, d), labels likewise (None
    where labels are exact), and the public projection matrix where there is one."""

    features: torch.Tensor
    labels: torch.Tensor | None
    projection: torch.Tensor | None = None


@dataclass(frozen=True)
class Run:
    features: torch.Tensor  # preprocessed D
    features_prime: torch.Tensor  # preprocessed D′
    labels: torch.Tensor  # one-hot (class indices where labels are exact)
    labels_prime: torch.Tensor
    sigma_x: float
    sigma_y: float
    trials: int
    generator: SecureRandom
    # None: the fast sampler on ``generator`` (seeded, reproducible); else e.g. SecureNoise.
    noise: NoiseSampler | None = None


def collect(
    chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], trials: int
) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*chunks, strict=True)
    return (
        torch.cat(xs).reshape(trials, -1, xs[0].shape[1]),
        torch.cat(ys).reshape(trials, -1, ys[0].shape[1]),
    )


def each(run: Run) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    yield run.features, run.labels
    yield run.features_prime, run.labels_prime


def stacked(run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    # trials copies of D, then trials copies of D′: one dataset, every row released on its own.
    features = torch.cat(
        [run.features.repeat(run.trials, 1), run.features_prime.repeat(run.trials, 1)]
    )
    labels = torch.cat([run.labels.repeat(run.trials, 1), run.labels_prime.repeat(run.trials, 1)])
    return features, labels


def split(
    x: torch.Tensor, y: torch.Tensor, trials: int, projection: torch.Tensor | None = None
) -> tuple[Release, Release]:
    x, y = x.reshape(2, trials, -1, x.shape[1]), y.reshape(2, trials, -1, y.shape[1])
    return Release(x[0], y[0], projection), Release(x[1], y[1], projection)
