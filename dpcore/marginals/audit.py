"""The marginal-based mechanisms' audit: their first step, the noisy one-way histograms,
through the mechanism's real ``noisy_counts`` and the worker's discretisation
(``discretise``), on the unit-scale worst-case neighbours
(``dpcore.audit.case.unit_neighbours``).

Neighbours: record 0 is ones on the first half of the 8 features in D and on the second half
in D′ (the worker's [0, 1] scaling keeps them: MST clips no row), class 1 in D and 2 in D′; the
others are all-zero, class 0. Discretised, record 0 sits in the top bin of features 1–4 and
the bottom bin of 5–8 in D, the reverse in D′, and in another class: it moves every one of the
k = 9 histograms by e_top − e_bottom (norm √2, the bound the accountant assumes), the most a
replacement can.

Released and scored: the k noisy histograms side by side, one row per trial, less the other
records' counts (n − 1 in each bottom bin and in class 0: the same in D and D′, so
subtracting them is post-processing the auditor may do); the public ``projection`` maps record
0's preprocessed features onto its contribution (D's through feature 1's column, D′'s through
feature 5's). Row model: record 0 in the single row, coefficient 1 — the exact likelihood ratio.

Claim: the mechanism's accountant with n_columns = 8, i.e. the whole release; the later
steps (most of the budget) are not run here, so the audit's bound sits well below the claim
unless the one-way step adds less noise than declared — which is what it catches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from dpcore.audit.case import N_FEATURES, AuditCase, Neighbours, fixed, unit_neighbours
from dpcore.audit.runs import Release, Run
from dpcore.marginals import discretise
from dpcore.mechanisms.noise import FastNoise
from dpcore.preprocessing import RowTransform

NoisyCounts = Callable[..., np.ndarray]


def preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    return RowTransform.unit_range(nb.lo, nb.hi, None).rows(X)


def _attributes(n_classes: int, bins: int) -> list[discretise.Attribute]:
    names = [str(j) for j in range(N_FEATURES)]
    return discretise.layout(names, (), (), n_classes, bins)


def _histograms(codes: np.ndarray, attributes: list[discretise.Attribute]) -> list[np.ndarray]:
    return [np.bincount(codes[:, a], minlength=x.size) for a, x in enumerate(attributes)]


def _run(
    bins: int, fn: Callable[..., Any], run: Run, p: Mapping[str, Any]
) -> tuple[Release, Release]:
    classes = 3
    attributes = _attributes(classes, bins)
    sampler = run.noise if run.noise is not None else FastNoise(run.generator)
    out = []
    for features, labels in (
        (run.features, run.labels),
        (run.features_prime, run.labels_prime),
    ):
        labels_np = labels.cpu().numpy()
        if labels_np.ndim == 2:
            labels_np = labels_np.argmax(axis=1)
        codes = discretise.encode(features.cpu().double().numpy(), labels_np, attributes)
        others = _histograms(codes[1:], attributes)
        rows = []
        for a, counts in enumerate(_histograms(codes, attributes)):
            stacked = np.broadcast_to(counts, (run.trials, counts.size))
            rows.append(fn(stacked, run.sigma_x, sampler) - others[a])
        out.append(torch.as_tensor(np.concatenate(rows, axis=1))[:, None, :])
    projection = _projection(attributes)
    return Release(out[0], None, projection), Release(out[1], None, projection)


def _projection(attributes: list[discretise.Attribute]) -> torch.Tensor:
    """Record 0's contribution from its preprocessed features: D's record (ones on features
    1–4) through feature 1's column, D′'s (ones on 5–8) through feature 5's."""
    nb = unit_neighbours({"n": 2})
    contributions = []
    for X, labels in ((nb.X[:1], nb.labels[:1]), (nb.X_prime[:1], nb.labels_prime[:1])):
        codes = discretise.encode(preprocess(X, nb), labels, attributes)
        contributions.append(np.concatenate(_histograms(codes, attributes)).astype(np.float64))
    projection = np.zeros((contributions[0].size, N_FEATURES))
    projection[:, 0] = contributions[0]
    projection[:, N_FEATURES // 2] = contributions[1]
    return torch.as_tensor(projection)


def one_way_case(
    noisy_counts: NoisyCounts, bins: int, claim_keys: Mapping[str, Any] | None = None
) -> AuditCase:
    """The audit of a mechanism whose first step is ``noisy_counts`` (counts, σ, sampler) on
    every attribute's histogram, numeric columns cut into ``bins``; ``claim_keys``: its
    accountant's keys besides n_columns."""
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=preprocess,
        function=lambda p: noisy_counts,
        run=lambda fn, run, p: _run(bins, fn, run, p),
        rows=lambda p: fixed(1.0, 1.0, rows=1),
        claim_keys=lambda p: {"n_columns": N_FEATURES, **(claim_keys or {})},
        exact_labels=True,
    )
