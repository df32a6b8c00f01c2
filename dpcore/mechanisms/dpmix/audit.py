"""DPMix's audit: unit-scale worst-case neighbours; mixtures through ``generate`` (or
``generate_by_record``), whose rows the score models exactly for the mixture assignment."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from dpcore.audit.case import AuditCase, RowModel, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, collect, each
from dpcore.mechanisms.dpmix.generate import generate, generate_by_record, mixtures_per_record


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    out = []
    for features, labels in each(run):
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
                collect(fn(features, labels, n_samples=p["n_samples"], **kwargs), 1)
                for _ in range(run.trials)
            ]
            x, y = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
        else:
            x, y = collect(
                fn(features, labels, n_samples=p["n_samples"] * run.trials, **kwargs), run.trials
            )
        out.append(Release(x, y))
    return out[0], out[1]


def rows(p: Mapping[str, Any]) -> RowModel:
    ell, n, t = p["mixture_degree"], p["n"], p["n_samples"]
    if p["assignment"] == "record":
        k = mixtures_per_record(n=n, mixture_degree=ell, n_samples=t)
        # Marginal rate; which rows hold it is coupled across the release (ignored here).
        return fixed(k / t, 1 / ell)
    # Mixtures are i.i.d. given the data: with displacement this is the exact likelihood ratio.
    return fixed(ell / n, 1 / ell, displaces=True)


def case() -> AuditCase:
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=unit_preprocess,
        function=lambda p: generate_by_record if p["assignment"] == "record" else generate,
        run=run,
        rows=rows,
        claim_keys=lambda p: {
            "n": p["n"],
            "mixture_degree": p["mixture_degree"],
            "n_samples": p["n_samples"],
            "assignment": p["assignment"],
            "noise_ratio": p["noise_ratio"],
        },
    )
