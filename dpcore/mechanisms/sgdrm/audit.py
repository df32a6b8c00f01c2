"""SGDRM's audit: unit-scale worst-case neighbours; mixtures i.i.d. given the data; the row
model discretises the clipped coefficient law (Gauss–Hermite nodes), an approximation that
weakens the test, never the bound."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dpcore.audit.case import AuditCase, RowModel, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, collect, each
from dpcore.mechanisms.sgdrm.accounting import default_coefficient_bound
from dpcore.mechanisms.sgdrm.generate import generate


def coefficient_bound(p: Mapping[str, Any]) -> float:
    bound = p.get("coefficient_bound")
    if bound is None:
        return default_coefficient_bound(p["mixture_width"])
    return float(bound)


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    if run.sigma_x != run.sigma_y:
        raise ValueError("sgdrm adds one noise level to features and labels")
    out = []
    for features, labels in each(run):
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
        out.append(Release(*collect(chunks, run.trials)))
    return out[0], out[1]


def rows(p: Mapping[str, Any]) -> RowModel:
    # c = clip(g, −b, b), g ~ N(0, 1/ℓ): Gauss–Hermite nodes of g, clipped.
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    bound = coefficient_bound(p)
    coefficients = np.clip(nodes / math.sqrt(p["mixture_width"]), -bound, bound)
    return RowModel(p["mixture_width"] / p["n"], coefficients, weights / weights.sum())


def case() -> AuditCase:
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=unit_preprocess,
        function=lambda p: generate,
        run=run,
        rows=rows,
        claim_keys=lambda p: {
            "n": p["n"],
            "mixture_width": p["mixture_width"],
            "n_samples": p["n_samples"],
            "coefficient_bound": coefficient_bound(p),
        },
    )
