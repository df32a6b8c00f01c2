"""Local perturbation's audit: unit-scale worst-case neighbours; D and D′ stacked trials times
in one call (every row is released on its own); only record 0's row can tell them apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dpcore.audit.case import AuditCase, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, collect, split, stacked
from dpcore.mechanisms.local_perturbation.generate import local_perturbation


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    features, labels = stacked(run)
    chunks = fn(
        features,
        labels,
        sigma_x=run.sigma_x,
        sigma_y=run.sigma_y,
        generator=run.generator,
        noise=run.noise,
    )
    x, y = collect(chunks, 1)
    return split(x[0], y[0], run.trials)


def case() -> AuditCase:
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=unit_preprocess,
        function=lambda p: local_perturbation,
        run=run,
        rows=lambda p: fixed(1.0, 1.0, rows=1),
        claim_keys=lambda p: {"n": p["n"], "noise_ratio": p["noise_ratio"]},
    )
