"""DP-CDA's audit, within one class (declared standardisation, mean 0.5 and std 0.5 per
feature): record 0 is +1 on the first half of the standardised features in D and −1 in D′
(norm 2, clipped to C: ‖x − x′‖ = 2C, the accountant's sensitivity); the others sit at the
mean (0 after standardising). Mixtures of one class are i.i.d. given the data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dpcore.audit.case import HALF, N_FEATURES, AuditCase, Neighbours, fixed, records
from dpcore.audit.runs import Release, Run, collect, each
from dpcore.mechanisms.dpcda.generate import generate
from dpcore.preprocessing import clip_rows_l2, standardise


def neighbours(params: Mapping[str, Any]) -> Neighbours:
    n = records(params)
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
    # The release job's `declared` standardisation (release.py).
    assert nb.feature_mean is not None and nb.feature_std is not None and nb.clip_norm
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
        },
        exact_labels=True,
    )
