"""An MST release job: discretise, measure the one-way marginals, select a spanning tree of
pairs, measure them, fit the model, draw records (``accounting`` for the analysis)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from dpcore.marginals import discretise, histograms, records
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.mst.accounting import HISTOGRAM_SENSITIVITY
from dpcore.mechanisms.mst.params import MSTParams
from dpcore.mechanisms.mst.selection import pair_scores, selection_rate, spanning_tree

if TYPE_CHECKING:
    from dpcore.mechanisms.noise import NoiseSampler

# Progress in the job's own units: the selection's rounds, the fit's steps, then sampling.
_PHASES = ("measuring", "selecting", "fitting", "sampling")


def noisy_counts(counts: np.ndarray, sigma: float, sampler: NoiseSampler) -> np.ndarray:
    """Histograms (one per row of ``counts``) plus N(0, σ²) per cell; one record moves each
    row by at most √2 (``accounting``)."""
    return histograms.noisy_counts(counts, sigma, sampler, HISTOGRAM_SENSITIVITY)


def release(params: MSTParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    from dpcore.marginals import model

    prepared = discretise.discretise(data, params.bins, int(ctx.noise.analysis["attributes"]))
    attributes, codes = prepared.attributes, prepared.codes
    k = len(attributes)
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
            model.measurement(
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
    rng = records.post_rng(ctx.generator)
    drawn = model.expand(model.sample(fitted, merged_sizes, rows, rng), compressed, rng)
    ctx.report(1, 1, _PHASES[3])
    names = [attributes[a].name for a in range(k)]
    return records.output(
        drawn,
        prepared,
        data,
        params.bins,
        rng,
        ctx.device,
        statistics=f"noisy one-way histograms of the {k} attributes, noisy two-way "
        f"histograms of {k - 1} pairs "
        + (
            "the exponential mechanism selected: "
            if params.structure == "tree"
            else "(each column with the label): "
        )
        + ", ".join(f"{names[a]}–{names[b]}" for a, b in edges),
        fit=f"Private-PGM, {params.iterations} mirror-descent steps",
    )
