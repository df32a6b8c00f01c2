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
(k-means share → 0, so the claimed μ is the final step's).

Model gaussian (``model: gaussian``): the step is ``moments.noisy_moments`` on the same
neighbours, and the released row also holds clusters 1 and 2's second-moment triangles. Record
0 adds z zᵀ there — not linear in z, but the audit has only two canaries, with disjoint
supports: the public ``gaussian_projection`` maps the declared canary z (of D) to
[z | 0 | tri(z zᵀ) | 0] and z′ (of D′) to [0 | z′ | 0 | tri(z′z′ᵀ)] exactly (a rank-two map
built from the case's own neighbours, not from what the run read). The second-moment blocks are
divided by σ₂/σ_s so every feature's noise is σ_s (the harness's one feature scale): ‖Δ‖² in
noise units is then 2/σ_s² + 2/σ₂² on the features and 2/σ_c² on the counts, the claimed μ²."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from dpcore.audit.case import HALF, N_FEATURES, AuditCase, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, each
from dpcore.mechanisms import moments
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
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


def _stacked(run: Run) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """D, then D′: the records (float64) stacked ``trials`` times and each one's cluster (its
    class's public centre), copy t's clusters renumbered t·3 + c (−1 stays −1: no cluster)."""
    centres = Centres(
        torch.zeros((CLASSES, N_FEATURES), dtype=torch.float64), torch.arange(CLASSES)
    )
    for features, classes in each(run):
        Z = features.double()
        groups = classes.argmax(dim=1) if classes.ndim == 2 else classes
        assignment = assign(Z, groups, centres, chunk=4096)
        copies = torch.arange(run.trials).repeat_interleave(Z.shape[0]) * CLASSES
        stacked = assignment.repeat(run.trials)
        yield Z.repeat(run.trials, 1), torch.where(stacked >= 0, stacked + copies, stacked)


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    """All trials in one call of the real step: the dataset stacked ``trials`` times, copy t's
    clusters renumbered t·3 + c. Every cluster's sum and count get their own noise, so copy t's
    clusters are one independent release of the step (the same law as ``trials`` calls)."""
    sampler = run.noise if run.noise is not None else FastNoise(run.generator)
    out = []
    for Z, assignment in _stacked(run):
        sums, counts = fn(
            Z,
            assignment,
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


def _gaussian(p: Mapping[str, Any]) -> bool:
    return p.get("model", "means") == "gaussian"


def second_ratio(p: Mapping[str, Any]) -> float:
    """σ₂/σ_s of the final step, as the accountant declares them (σ = 1, no k-means step)."""
    scales = ClustMixDPEvent(
        sigma=1.0,
        kmeans_steps=0,
        kmeans_share=ONE_STEP_SHARE,
        count_share=float(p["count_share"]),
        moment_share=float(p["moment_share"]),
    ).scales()
    return scales["second"] / scales["sums"]


def gaussian_projection(p: Mapping[str, Any]) -> torch.Tensor:
    """(2d + 2w × d), w = d(d + 1)/2: the declared canaries' contributions to the released row
    [sums 1 | sums 2 | second 1 | second 2] (second-moment blocks ÷ σ₂/σ_s), as a linear map
    exact on both canaries (module docstring)."""
    nb = unit_neighbours(p)
    z = torch.as_tensor(unit_preprocess(nb.X[:1], nb)[0], dtype=torch.float64)
    z_prime = torch.as_tensor(unit_preprocess(nb.X_prime[:1], nb)[0], dtype=torch.float64)
    d, w = N_FEATURES, N_FEATURES * (N_FEATURES + 1) // 2
    ratio = second_ratio(p)
    out = torch.zeros((2 * d + 2 * w, d), dtype=torch.float64)
    for block, v in ((0, z), (1, z_prime)):
        image = torch.zeros(2 * d + 2 * w, dtype=torch.float64)
        image[block * d : (block + 1) * d] = v
        start = 2 * d + block * w
        image[start : start + w] = moments.triangle(v[:, None] * v[None, :]) / ratio
        out += image[:, None] * v[None, :] / float(v @ v)
    return out


def run_gaussian(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    """``run`` for model gaussian: all trials in one call of ``moments.noisy_moments`` (copy
    t's clusters renumbered t·3 + c, each with its own noise)."""
    sampler = run.noise if run.noise is not None else FastNoise(run.generator)
    ratio = second_ratio(p)
    scales = moments.Scales(counts=run.sigma_y, sums=run.sigma_x, second=run.sigma_x * ratio)
    out = []
    for Z, assignment in _stacked(run):
        stats = fn(
            Z,
            assignment,
            torch.arange(CLASSES).repeat(run.trials),
            second_dim=N_FEATURES,
            scales=scales,
            sampler=sampler,
        )
        sums = stats.sums.reshape(run.trials, CLASSES, N_FEATURES)
        second = stats.second.reshape(run.trials, CLASSES, -1) / ratio
        x = torch.cat([sums[:, 1], sums[:, 2], second[:, 1], second[:, 2]], dim=1)[:, None, :]
        y = stats.counts.reshape(run.trials, CLASSES)[:, None, :]
        out.append(Release(x, y, gaussian_projection(p)))
    return out[0], out[1]


def case() -> AuditCase:
    return AuditCase(
        neighbours=lambda p: unit_neighbours(p),
        preprocess=unit_preprocess,
        function=lambda p: moments.noisy_moments if _gaussian(p) else noisy_statistics,
        run=lambda fn, r, p: run_gaussian(fn, r, p) if _gaussian(p) else run(fn, r, p),
        # Record 0 is in its cluster's sum and count with certainty, with coefficient 1.
        rows=lambda p: fixed(1.0, 1.0),
        claim_keys=lambda p: {
            "clusters_per_class": 1,
            "kmeans_refine": 0,
            "kmeans_share": ONE_STEP_SHARE,
            "count_share": p["count_share"],
            "model": p.get("model", "means"),
            "moment_share": p.get("moment_share", 0.5),
        },
        label_scale="counts",
    )
