"""Random projection's audit: unit-scale worst-case neighbours; D and D′ stacked trials times
in one call, sharing the data-independent matrix R (the audit is conditional on it, as the
accountant's proof is)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dpcore.audit.case import AuditCase, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, collect, split, stacked
from dpcore.mechanisms.random_projection.generate import random_projection


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    features, labels = stacked(run)
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
    x, y = collect(chunks, 1)
    return split(x[0], y[0], run.trials, matrix)


def case() -> AuditCase:
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=unit_preprocess,
        function=lambda p: random_projection,
        run=run,
        rows=lambda p: fixed(1.0, 1.0, rows=1),
        claim_keys=lambda p: {
            "n": p["n"],
            "projection_dim": p["projection_dim"],
            "spectral_norm": p["spectral_norm"],
            "noise_ratio": p["noise_ratio"],
        },
    )
