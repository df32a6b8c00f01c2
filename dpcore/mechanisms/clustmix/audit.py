"""ClustMix ``dp``'s audit: one noisy step — every cluster's noisy sum and count over public
centres (``kmeans.noisy_statistics``, the function every DP k-means step and the final step
call) — on neighbours where record 0 moves between clusters, the worst case of the analysis.

Neighbours (``unit_neighbours``): record 0 is ones on the first half of the features with class
1 in D, ones on the second half with class 2 in D′; the others are all-zero with class 0. One
cluster per class (public centres), so record 0 sits in cluster 1 in D and in cluster 2 in D′:
the sums of clusters 1 and 2 move by x and x′ and their counts by 1 each — ‖Δ‖² = 2 on the
sums and 2 on the counts, the μ² = 2/σ_s² + 2/σ_c² of the accountant.

A trial's released row is the sums of clusters 1 and 2 side by side (2d features, std σ_s) and
the three counts (std σ_c, scored as the harness's labels). The canary enters through the
public ``projection``: x (first half) lands in cluster 1's block, x′ (second half) in cluster
2's block — their supports are disjoint. The claim is the ``tight`` accountant's for one step
(k-means share → 0, so the claimed μ is the final step's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from dpcore.audit.case import HALF, N_FEATURES, AuditCase, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, each
from dpcore.mechanisms.kmeans import Centres, assign, noisy_statistics
from dpcore.mechanisms.noise import FastNoise

CLASSES = 3
# The claimed event: the final step alone (a vanishing k-means share, one refinement-free
# cluster per class).
ONE_STEP_SHARE = 1e-12


def projection() -> torch.Tensor:
    """(2d × d): a record's features into the [cluster 1 | cluster 2] blocks by its support."""
    P = torch.zeros((2 * N_FEATURES, N_FEATURES), dtype=torch.float64)
    for i in range(HALF):
        P[i, i] = 1.0
    for i in range(HALF, N_FEATURES):
        P[N_FEATURES + i, i] = 1.0
    return P


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    """All trials in one call of the real step: the dataset stacked ``trials`` times, copy t's
    clusters renumbered t·3 + c. Every cluster's sum and count get their own noise, so copy t's
    clusters are one independent release of the step (the same law as ``trials`` calls)."""
    sampler = run.noise if run.noise is not None else FastNoise(run.generator)
    centres = Centres(
        torch.zeros((CLASSES, N_FEATURES), dtype=torch.float64), torch.arange(CLASSES)
    )
    out = []
    for features, classes in each(run):
        Z = features.double()
        groups = classes.argmax(dim=1) if classes.ndim == 2 else classes
        assignment = assign(Z, groups, centres, chunk=4096)
        copies = torch.arange(run.trials).repeat_interleave(Z.shape[0]) * CLASSES
        stacked = assignment.repeat(run.trials)
        sums, counts = fn(
            Z.repeat(run.trials, 1),
            torch.where(stacked >= 0, stacked + copies, stacked),
            CLASSES * run.trials,
            sigma_sums=run.sigma_x,
            sigma_counts=run.sigma_y,
            sampler=sampler,
            error=0.0,
        )
        sums = sums.reshape(run.trials, CLASSES, N_FEATURES)
        x = torch.cat([sums[:, 1], sums[:, 2]], dim=1)[:, None, :]
        y = counts.reshape(run.trials, CLASSES)[:, None, :]
        out.append(Release(x, y, projection()))
    return out[0], out[1]


def case() -> AuditCase:
    return AuditCase(
        neighbours=lambda p: unit_neighbours(p),
        preprocess=unit_preprocess,
        function=lambda p: noisy_statistics,
        run=run,
        # Record 0 is in its cluster's sum and count with certainty, with coefficient 1.
        rows=lambda p: fixed(1.0, 1.0),
        claim_keys=lambda p: {
            "clusters_per_class": 1,
            "kmeans_refine": 0,
            "kmeans_share": ONE_STEP_SHARE,
            "count_share": p["count_share"],
        },
        label_scale="counts",
    )
