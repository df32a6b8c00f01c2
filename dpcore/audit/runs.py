"""The real mechanism runs of an audit: ``trials`` releases of D and of D′ per mechanism,
through the dpcore function the worker calls (possibly wrapped by a test seam).

Batched where that is the same distribution: mixtures of dpmix (mixture assignment), dpcda and
sgdrm are i.i.d. given the data, so one call with T·trials mixtures is trials independent
releases; the baselines release every record on its own, so one call on D and D′ stacked trials
times each is trials releases of each (sharing the data-independent projection matrix R: the
audit is conditional on it, as the accountant's proof is). dpmix's record assignment couples
the T mixtures of a release, so it runs once per trial.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dpcore.accounting import sgdrm as sgdrm_accountant
from dpcore.mechanisms.noise import NoiseSampler


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
    labels: torch.Tensor  # one-hot (class indices for dpcda)
    labels_prime: torch.Tensor
    sigma_x: float
    sigma_y: float
    trials: int
    generator: torch.Generator
    # None: the fast sampler on ``generator`` (seeded, reproducible); else e.g. SecureNoise.
    noise: NoiseSampler | None = None


def coefficient_bound(p: Mapping[str, Any]) -> float:
    bound = p.get("coefficient_bound")
    if bound is None:
        return sgdrm_accountant.default_coefficient_bound(p["mixture_width"])
    return float(bound)


def _collect(
    chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], trials: int
) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*chunks, strict=True)
    return (
        torch.cat(xs).reshape(trials, -1, xs[0].shape[1]),
        torch.cat(ys).reshape(trials, -1, ys[0].shape[1]),
    )


def _each(run: Run) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    yield run.features, run.labels
    yield run.features_prime, run.labels_prime


def run_dpmix(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    out = []
    for features, labels in _each(run):
        kwargs = {
            "mixture_degree": p["mixture_degree"],
            "sigma_x": run.sigma_x,
            "sigma_y": run.sigma_y,
            "generator": run.generator,
            "noise": run.noise,
        }
        if p["assignment"] == "record":
            # One release couples its T mixtures (each record joins k of them): one call each.
            parts = [
                _collect(fn(features, labels, n_samples=p["n_samples"], **kwargs), 1)
                for _ in range(run.trials)
            ]
            x, y = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
        else:
            x, y = _collect(
                fn(features, labels, n_samples=p["n_samples"] * run.trials, **kwargs), run.trials
            )
        out.append(Release(x, y))
    return out[0], out[1]


def run_dpcda(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    out = []
    for features, classes in _each(run):
        # One class: n_samples = T_c·trials gives T_c·trials i.i.d. mixtures of that class.
        chunks = fn(
            features,
            classes,
            n_classes=1,
            mixture_degree=p["mixture_degree"],
            n_samples=p["n_samples"] * run.trials,
            sigma=run.sigma_x,
            clip_norm=p["clip_norm"],
            generator=run.generator,
            noise=run.noise,
        )
        x, _ = _collect(chunks, run.trials)
        out.append(Release(x, None))
    return out[0], out[1]


def run_sgdrm(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    if run.sigma_x != run.sigma_y:
        raise ValueError("sgdrm adds one noise level to features and labels")
    out = []
    for features, labels in _each(run):
        chunks = fn(
            features,
            labels,
            mixture_width=p["mixture_width"],
            n_samples=p["n_samples"] * run.trials,
            coefficient_bound=coefficient_bound(p),
            sigma=run.sigma_x,
            generator=run.generator,
            noise=run.noise,
        )
        out.append(Release(*_collect(chunks, run.trials)))
    return out[0], out[1]


def _stacked(run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    # trials copies of D, then trials copies of D′: one dataset, every row released on its own.
    features = torch.cat(
        [run.features.repeat(run.trials, 1), run.features_prime.repeat(run.trials, 1)]
    )
    labels = torch.cat([run.labels.repeat(run.trials, 1), run.labels_prime.repeat(run.trials, 1)])
    return features, labels


def _split(
    x: torch.Tensor, y: torch.Tensor, trials: int, projection: torch.Tensor | None = None
) -> tuple[Release, Release]:
    x, y = x.reshape(2, trials, -1, x.shape[1]), y.reshape(2, trials, -1, y.shape[1])
    return Release(x[0], y[0], projection), Release(x[1], y[1], projection)


def run_local(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    features, labels = _stacked(run)
    chunks = fn(
        features,
        labels,
        sigma_x=run.sigma_x,
        sigma_y=run.sigma_y,
        generator=run.generator,
        noise=run.noise,
    )
    x, y = _collect(chunks, 1)
    return _split(x[0], y[0], run.trials)


def run_projection(
    fn: Callable[..., Any], run: Run, p: Mapping[str, Any]
) -> tuple[Release, Release]:
    features, labels = _stacked(run)
    matrix, chunks = fn(
        features,
        labels,
        projection_dim=p["projection_dim"],
        spectral_norm=p["spectral_norm"],
        sigma_x=run.sigma_x,
        sigma_y=run.sigma_y,
        generator=run.generator,
        noise=run.noise,
    )
    x, y = _collect(chunks, 1)
    return _split(x[0], y[0], run.trials, matrix)
