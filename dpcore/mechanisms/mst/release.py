"""An MST release job: discretise, measure the one-way marginals, select a spanning tree of
pairs, measure them, fit the model, draw records (``accounting`` for the analysis)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.mst import discretise
from dpcore.mechanisms.mst.accounting import HISTOGRAM_SENSITIVITY
from dpcore.mechanisms.mst.params import MSTParams
from dpcore.mechanisms.mst.selection import pair_scores, selection_rate, spanning_tree
from dpcore.preprocessing import RowTransform, one_hot

if TYPE_CHECKING:
    from dpcore.mechanisms.noise import NoiseSampler

CHUNK_ROWS = 1 << 16
# Progress in the job's own units: the selection's rounds, the fit's steps, then sampling.
_PHASES = ("measuring", "selecting", "fitting", "sampling")


def noisy_counts(counts: np.ndarray, sigma: float, sampler: NoiseSampler) -> np.ndarray:
    """Histograms (one per row of ``counts``) plus N(0, σ²) per cell; one record moves each
    row by at most √2 (``accounting``)."""
    values = torch.as_tensor(np.atleast_2d(counts), dtype=torch.float64)
    noised = sampler(values, sigma=sigma, sensitivity=HISTOGRAM_SENSITIVITY)
    return noised.double().numpy().reshape(np.shape(counts))


def _rng(ctx: RunContext) -> np.random.Generator:
    """Post-processing randomness (bins, merged values, ancestral draws), seeded from the
    release's secure source."""
    return np.random.default_rng([int(w) for w in ctx.generator.words(4)])


def release(params: MSTParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    from dpcore.mechanisms.mst import model

    attributes = discretise.layout(
        data.feature_names,
        getattr(data, "categorical_blocks", ()),
        getattr(data, "missing_indicators", ()),
        len(data.classes),
        params.bins,
    )
    k = len(attributes)
    declared = int(ctx.noise.analysis["attributes"])
    if k != declared:
        raise ValueError(f"the release was charged for {declared} attributes; the data has {k}")
    transform = RowTransform.unit_range(data.lo, data.hi, None)
    codes = discretise.encode(transform.rows(data.X), data.labels, attributes)
    sizes = [a.size for a in attributes]
    n = data.n_rows
    sigma_one, sigma_two = ctx.sigma("one_way"), ctx.sigma("two_way")
    ctx.report(0, 1, _PHASES[0])

    one_way = [
        noisy_counts(np.bincount(codes[:, a], minlength=sizes[a]), sigma_one, ctx.sampler)
        for a in range(k)
    ]
    compressed = model.compress(one_way, sigma_one)
    merged = compressed.codes(codes)
    merged_sizes = compressed.sizes
    merged_one_way = [
        np.bincount(compressed.mapping[a], weights=one_way[a], minlength=merged_sizes[a])
        for a in range(k)
    ]

    if params.structure == "label":
        # A public structure: every column with the label (the last attribute).
        edges = [(a, k - 1) for a in range(k - 1)]
    else:
        pairs = list(itertools.combinations(range(k), 2))
        scores = pair_scores(merged, merged_sizes, merged_one_way, pairs)
        rate = selection_rate(ctx.noise.analysis["selection_epsilon"])
        edges = spanning_tree(
            scores,
            pairs,
            k,
            rate,
            ctx.generator,
            report=lambda done, total: ctx.report(done, total, _PHASES[1]),
        )

    measurements = model.one_way_measurements(one_way, sizes, compressed, sigma_one)
    for a, b in edges:
        joint = np.bincount(
            merged[:, a] * merged_sizes[b] + merged[:, b],
            minlength=merged_sizes[a] * merged_sizes[b],
        ).reshape(merged_sizes[a], merged_sizes[b])
        measurements.append(
            model.two_way_measurement(
                noisy_counts(joint.ravel(), sigma_two, ctx.sampler).reshape(joint.shape),
                (a, b),
                sigma_two,
            )
        )

    fitted = model.estimate(
        merged_sizes,
        measurements,
        n,
        params.iterations,
        report=lambda done: ctx.report(done, params.iterations, _PHASES[2]),
    )
    rows = params.n_samples if params.n_samples is not None else n
    rng = _rng(ctx)
    drawn = model.expand(model.sample(fitted, edges, k, rows, rng), compressed, rng)
    ctx.report(1, 1, _PHASES[3])
    unit, labels = discretise.decode(drawn, attributes, data.X.shape[1], rng)
    names = [attributes[a].name for a in range(k)]
    return ReleaseOutput(
        rows=rows,
        feature_names=list(data.feature_names),
        chunks=_chunks(unit, labels, len(data.classes), ctx.device),
        preprocessing={
            "features": f"each numeric column's declared [lo, hi] cut into {params.bins} "
            "equal-width bins, each missing-value indicator and categorical column and the "
            "label one attribute each (public rules); released values drawn uniformly within "
            "their bin, in raw units",
            "labels": "each row's class, drawn with its features from the model (exact)",
            "statistics": f"noisy one-way histograms of the {k} attributes, noisy two-way "
            f"histograms of {k - 1} pairs "
            + (
                "the exponential mechanism selected: "
                if params.structure == "tree"
                else "(each column with the label): "
            )
            + ", ".join(f"{names[a]}–{names[b]}" for a, b in edges),
            "rows": "drawn from the graphical model fitted to the noisy histograms "
            f"(Private-PGM, {params.iterations} mirror-descent steps): post-processing",
        },
        progress="own",
        transform=transform,
    )


def _chunks(
    unit: np.ndarray, labels: np.ndarray, classes: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, len(unit), CHUNK_ROWS):
        stop = min(len(unit), start + CHUNK_ROWS)
        x = torch.as_tensor(unit[start:stop], dtype=torch.float32, device=device)
        y = torch.as_tensor(
            one_hot(labels[start:stop], classes), dtype=torch.float32, device=device
        )
        yield x, y
