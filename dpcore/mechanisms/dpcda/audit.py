"""DP-CDA's audit, within one class, in either standardisation whose sensitivity it claims:

- ``unit_range`` (the default, R = √2·C): record 0 is ones on the first half of the features
  in D and on the second half in D′ (after the [0, 1] scaling and the clip to C: orthogonal
  records of norm C, ‖x − x′‖ = √2·C); the others are all zero;
- ``declared`` (mean 0.5, std 0.5 per feature; R = 2C): record 0 is +1 on the first half of
  the standardised features in D and −1 in D′ (norm 2, clipped to C: ‖x − x′‖ = 2C); the
  others sit at the mean (0 after standardising).

Either way the others contribute nothing along the canary's direction. Mixtures of one class
are i.i.d. given the data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dpcore.audit.case import HALF, N_FEATURES, AuditCase, Neighbours, fixed, records
from dpcore.audit.runs import Release, Run, collect, each
from dpcore.mechanisms.dpcda.generate import generate
from dpcore.preprocessing import clip_rows_l2, scale_to_unit, standardise


def _unit_range(params: Mapping[str, Any]) -> bool:
    return params.get("standardization", "unit_range") == "unit_range"


def neighbours(params: Mapping[str, Any]) -> Neighbours:
    n = records(params)
    if _unit_range(params):
        X = np.zeros((n, N_FEATURES))
        X_prime = X.copy()
        X[0, :HALF] = 1.0
        X_prime[0, HALF:] = 1.0
        labels = np.zeros(n, dtype=np.int64)
        return Neighbours(
            X,
            X_prime,
            labels,
            labels.copy(),
            np.zeros(N_FEATURES),
            np.ones(N_FEATURES),
            n_classes=1,
            clip_norm=float(params["clip_norm"]),
        )
    X = np.full((n, N_FEATURES), 0.5)
    X_prime = X.copy()
    X[0, :HALF] = 1.0
    X_prime[0, :HALF] = 0.0
    labels = np.zeros(n, dtype=np.int64)
    return Neighbours(
        X,
        X_prime,
        labels,
        labels.copy(),
        np.zeros(N_FEATURES),
        np.ones(N_FEATURES),
        n_classes=1,
        feature_mean=np.full(N_FEATURES, 0.5),
        feature_std=np.full(N_FEATURES, 0.5),
        clip_norm=float(params["clip_norm"]),
    )


def preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    # The release job's `unit_range` or `declared` standardisation (release.py).
    assert nb.clip_norm
    if nb.feature_mean is None:
        return clip_rows_l2(scale_to_unit(X, nb.lo, nb.hi), nb.clip_norm)
    assert nb.feature_std is not None
    return clip_rows_l2(
        standardise(np.clip(X, nb.lo, nb.hi), nb.feature_mean, nb.feature_std), nb.clip_norm
    )


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    out = []
    for features, classes in each(run):
        # One class: n_samples = T_c·trials gives T_c·trials i.i.d. mixtures of that class.
        chunks = fn(
            features,
            classes,
            n_classes=1,
            mixture_degree=p["mixture_degree"],
            n_samples=p["n_samples"] * run.trials,
            sigma=run.sigma_x,
            clip_norm=p["clip_norm"],
            nonnegative=_unit_range(p),
            generator=run.generator,
            noise=run.noise,
        )
        x, _ = collect(chunks, run.trials)
        out.append(Release(x, None))
    return out[0], out[1]


def case() -> AuditCase:
    return AuditCase(
        neighbours=neighbours,
        preprocess=preprocess,
        function=lambda p: generate,
        run=run,
        rows=lambda p: fixed(p["mixture_degree"] / p["n"], 1 / p["mixture_degree"], displaces=True),
        claim_keys=lambda p: {
            "n": p["n"],
            "mixture_degree": p["mixture_degree"],
            "n_samples": p["n_samples"],
            "clip_norm": p["clip_norm"],
            "n_classes": 1,
            "min_class_size": p["n"],
            "standardization": "unit_range" if _unit_range(p) else "declared",
            # One class of the public n records: its size is public, so declared class sizes
            # (m = n, the mixing alone) are replace-one here; the default 'dp' adds noisy
            # counts and β to the same mixing, a larger claim.
            "class_sizes": "declared",
        },
        exact_labels=True,
    )
