"""An AIM release job: discretise, measure every one-way marginal, then rounds of select (the
exponential mechanism on how badly the model fits each candidate) and measure, refitting the
model each round, until the budget is spent; then draw records from the model
(``accounting`` for the analysis, ``selection`` for the scores).

The budget is kept in exact rationals: each step's zCDP cost is computed from the σ and rate
it really uses and added before it runs, and no step runs whose cost would pass the budget.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from dpcore.marginals import discretise, histograms, records
from dpcore.marginals.exponential import exponential_mechanism, selection_rate
from dpcore.mechanisms.aim import selection
from dpcore.mechanisms.aim.accounting import (
    GAUSSIAN_SHARE,
    HISTOGRAM_SENSITIVITY,
    gaussian_cost,
    selection_cost,
)
from dpcore.mechanisms.aim.params import AIMParams
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext

if TYPE_CHECKING:
    from dpcore.mechanisms.noise import NoiseSampler

# Progress: the budget spent, in thousandths, then sampling.
_PROGRESS_UNITS = 1000
_PHASES = ("measuring", "rounds", "sampling")


class Budget:
    """ρ in exact rationals: what the accountant charged, what the steps so far took."""

    def __init__(self, rho: float):
        # The accountant's ρ, a hair less so float rounding on its side cannot matter.
        self.total = Fraction(rho) * (1 - Fraction(1, 10**12))
        self.used = Fraction(0)

    @property
    def left(self) -> Fraction:
        return self.total - self.used

    def spend(self, cost: Fraction) -> None:
        if self.used + cost > self.total:
            raise ValueError("an AIM step would pass its budget")
        self.used += cost


def last_round(left: Fraction) -> tuple[float, float]:
    """σ and ε of a round taking what is left: the Gaussian's share at most 0.9·left, the
    selection's at most 0.1·left (each rounded against the mechanism)."""
    gaussian = GAUSSIAN_SHARE * left
    sigma = math.sqrt(float(1 / gaussian))
    while gaussian_cost(sigma) > gaussian:
        sigma = math.nextafter(sigma, math.inf)
    share = (1 - GAUSSIAN_SHARE) * left
    epsilon = math.sqrt(float(8 * share))
    while selection_cost(Fraction(epsilon)) > share:
        epsilon = math.nextafter(epsilon, 0.0)
    return sigma, epsilon


def _cost(sigma: float, epsilon: float) -> Fraction:
    """A round's planned zCDP cost at (σ, ε)."""
    return gaussian_cost(sigma) + selection_cost(Fraction(epsilon))


def noisy_counts(counts: np.ndarray, sigma: float, sampler: NoiseSampler) -> np.ndarray:
    """A histogram plus N(0, σ²) per cell; one record moves it by at most √2 (``accounting``)."""
    return histograms.noisy_counts(counts, sigma, sampler, HISTOGRAM_SENSITIVITY)


def release(params: AIMParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    from dpcore.marginals import model

    analysis = ctx.noise.analysis
    prepared = discretise.discretise(data, params.bins, int(analysis["attributes"]))
    attributes, codes = prepared.attributes, prepared.codes
    k = len(attributes)
    sizes = [a.size for a in attributes]
    n = data.n_rows
    budget = Budget(analysis["rho"])
    sigma, epsilon = ctx.sigma("one_way"), analysis["selection_epsilon"]
    ctx.report(0, _PROGRESS_UNITS, _PHASES[0])

    measurements = []
    for a in range(k):
        budget.spend(gaussian_cost(sigma))
        noisy = noisy_counts(np.bincount(codes[:, a], minlength=sizes[a]), sigma, ctx.sampler)
        measurements.append(model.measurement(noisy, (a,), sigma))
    fitted = model.estimate(sizes, measurements, n, params.iterations, report=lambda _: None)

    ctx.report(0, _PROGRESS_UNITS, _PHASES[1])
    candidates = selection.Candidates(codes, sizes)
    measured: list[tuple[int, ...]] = [(a,) for a in range(k)]
    chosen: list[tuple[int, ...]] = []
    max_rounds = params.max_rounds if params.max_rounds is not None else len(candidates.cliques)
    last = False
    while not last:
        rounds_left = max_rounds - len(chosen)
        # At most ``max_rounds`` rounds (the job's time): a round takes at least an even share
        # of what is left over the rounds left (a public rule on released state).
        share = budget.left / rounds_left
        if _cost(sigma, epsilon) < share:
            sigma, epsilon = last_round(share)
        if rounds_left <= 1 or budget.left < 2 * _cost(sigma, epsilon):
            sigma, epsilon = last_round(budget.left)
            last = True
        rate = selection_rate(epsilon, candidates.sensitivity)
        budget.spend(gaussian_cost(sigma) + selection_cost(2 * rate * candidates.sensitivity))
        size_limit = params.max_model_size * float(budget.used / budget.total)
        tree = model.junction_tree(fitted, sizes)
        open_ = candidates.within(measured, size_limit)
        scores = candidates.scores(open_, tree, sigma)
        clique = open_[exponential_mechanism(scores, rate, ctx.generator)]
        noisy = noisy_counts(candidates.counts(clique), sigma, ctx.sampler)
        measurements.append(model.measurement(noisy, clique, sigma))
        measured.append(clique)
        chosen.append(clique)
        before = tree.marginal(clique)
        fitted = model.estimate(
            sizes, measurements, n, params.iterations, report=lambda _: None, warm_start=fitted
        )
        after = model.junction_tree(fitted, sizes).marginal(clique)
        # AIM's annealing: a measurement that barely moved the model asks for finer noise.
        if np.abs(after - before).sum() <= selection.expected_error(sigma, before.size):
            sigma, epsilon = sigma / 2, epsilon * 2
        done = int(_PROGRESS_UNITS * budget.used / budget.total)
        ctx.report(min(done, _PROGRESS_UNITS - 1), _PROGRESS_UNITS, _PHASES[1])

    rows = params.n_samples if params.n_samples is not None else n
    rng = records.post_rng(ctx.generator)
    drawn = model.sample(fitted, sizes, rows, rng)
    ctx.report(_PROGRESS_UNITS, _PROGRESS_UNITS, _PHASES[2])
    names = [attributes[a].name for a in range(k)]
    return records.output(
        drawn,
        prepared,
        data,
        params.bins,
        rng,
        ctx.device,
        statistics=f"noisy one-way histograms of the {k} attributes, then {len(chosen)} "
        "rounds, each a marginal the exponential mechanism selected and its noisy "
        "histogram: " + ", ".join("–".join(names[a] for a in c) for c in chosen),
        fit=f"Private-PGM, {params.iterations} mirror-descent steps a fit",
    )
