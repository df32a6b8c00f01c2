"""Per mechanism: worst-case neighbours, the worker's preprocessing, the run, and the row model
of the distinguishing score.

Every audit replaces record 0 (replace-one, n public) and makes the replaced record move the
release as far as the accountant's sensitivity allows:

- unit-scale mechanisms (dpmix, sgdrm, local_perturbation, random_projection): features are
  mapped to [0, 1] and rows to L2 norm ≤ 1, so two records differ by at most √2; record 0 is
  ones on the first half of the 8 features in D and ones on the second half in D′ (norm 2
  before the norm scaling, 1 after: two orthogonal unit records, ‖x − x′‖ = √2), with label 1
  in D and 2 in D′ (‖e₁ − e₂‖ = √2). The other records are all-zero features with label 0: they
  contribute nothing along the canary's directions, whatever subset or coefficient they get.
- dpcda (declared standardisation, mean 0.5 and std 0.5 per feature, one class): record 0 is
  +1 on the first half of the standardised features in D and −1 in D′ (norm 2, clipped to C:
  ‖x − x′‖ = 2C, the accountant's sensitivity); the others sit at the mean (0 after
  standardising).

How each mechanism runs: `dpcore.audit.runs`.

Score: the log-likelihood ratio of D′ against D of a model of each released row: a row holds
record 0 with probability q, times a coefficient c of known law, plus the release's Gaussian
noise; rows are treated as independent. That is the exact Neyman–Pearson statistic for the
baselines, dpmix's mixture assignment and dpcda (their rows are independent given the data);
for sgdrm (discretised coefficient law) and dpmix's record assignment (coupled rows) it is an
approximation, which makes the test weaker, never the bound invalid: any score gives one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcore.accounting.registry import Key
from dpcore.audit import runs
from dpcore.audit.runs import Release, Run, coefficient_bound
from dpcore.mechanisms import baselines, dpcda, dpmix, sgdrm
from dpcore.preprocessing import clip_rows_l2, standardise, unit_features

N_FEATURES = 8
HALF = N_FEATURES // 2

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Neighbours:
    """Raw D and D′ (record 0 differs), their labels and the public facts of both."""

    X: np.ndarray
    X_prime: np.ndarray
    labels: np.ndarray
    labels_prime: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n_classes: int
    # dpcda's declared standardisation and clip norm (None elsewhere).
    feature_mean: np.ndarray | None = None
    feature_std: np.ndarray | None = None
    clip_norm: float | None = None


Preprocess = Callable[[np.ndarray, Neighbours], np.ndarray]


@dataclass(frozen=True)
class RowModel:
    """Record 0's presence in a released row: the first ``rows`` rows of a trial (all when
    None) may hold it, each with probability ``inclusion``, scaled by a coefficient of law
    (values, weights). ``displaces``: a fixed-size subset that holds record 0 holds one other
    record fewer (record 1 stands for them all: the others are identical)."""

    inclusion: float
    coefficients: np.ndarray
    weights: np.ndarray
    rows: int | None = None
    displaces: bool = False


@dataclass(frozen=True)
class AuditedMechanism:
    name: str
    keys: tuple[Key, ...]
    neighbours: Callable[[Mapping[str, Any]], Neighbours]
    preprocess: Preprocess  # what the worker does (the harness can swap it)
    function: Callable[..., Any]  # the dpcore mechanism function (the harness can wrap it)
    run: Callable[[Callable[..., Any], Run, Mapping[str, Any]], tuple[Release, Release]]
    rows: Callable[[Mapping[str, Any]], RowModel]
    claim_keys: Callable[[Mapping[str, Any]], dict[str, Any]]
    exact_labels: bool = False


# --- neighbours and preprocessing ------------------------------------------------------------


def _records(params: Mapping[str, Any]) -> int:
    n = int(params["n"])
    if n < 2:
        raise ValueError("the audit needs n >= 2 (record 1 stands for the others)")
    return n


def _unit_neighbours(params: Mapping[str, Any]) -> Neighbours:
    n = _records(params)
    X = np.zeros((n, N_FEATURES))
    X_prime = X.copy()
    X[0, :HALF] = 1.0
    X_prime[0, HALF:] = 1.0
    labels = np.zeros(n, dtype=np.int64)
    labels_prime = labels.copy()
    labels[0], labels_prime[0] = 1, 2
    lo, hi = np.zeros(N_FEATURES), np.ones(N_FEATURES)
    return Neighbours(X, X_prime, labels, labels_prime, lo, hi, n_classes=3)


def _unit_preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    return unit_features(X, nb.lo, nb.hi)


def _dpcda_neighbours(params: Mapping[str, Any]) -> Neighbours:
    n = _records(params)
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


def _dpcda_preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    # The worker's `declared` standardisation (worker/mechanisms.py, _dpcda).
    assert nb.feature_mean is not None and nb.feature_std is not None and nb.clip_norm
    return clip_rows_l2(
        standardise(np.clip(X, nb.lo, nb.hi), nb.feature_mean, nb.feature_std), nb.clip_norm
    )


# --- row models ------------------------------------------------------------------------------


def _fixed(
    inclusion: float, coefficient: float, rows: int | None = None, displaces: bool = False
) -> RowModel:
    return RowModel(inclusion, np.array([coefficient]), np.array([1.0]), rows, displaces)


def _sgdrm_rows(p: Mapping[str, Any]) -> RowModel:
    # c = clip(g, −b, b), g ~ N(0, 1/ℓ): Gauss–Hermite nodes of g, clipped.
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    bound = coefficient_bound(p)
    coefficients = np.clip(nodes / math.sqrt(p["mixture_width"]), -bound, bound)
    return RowModel(p["mixture_width"] / p["n"], coefficients, weights / weights.sum())


def _dpmix_rows(p: Mapping[str, Any]) -> RowModel:
    ell, n, t = p["mixture_degree"], p["n"], p["n_samples"]
    if p["assignment"] == "record":
        k = dpmix.mixtures_per_record(n=n, mixture_degree=ell, n_samples=t)
        # Marginal rate; which rows hold it is coupled across the release (ignored here).
        return _fixed(k / t, 1 / ell)
    # Mixtures are i.i.d. given the data: with displacement this is the exact likelihood ratio.
    return _fixed(ell / n, 1 / ell, displaces=True)


# --- the mechanisms ----------------------------------------------------------------------------

# Defaults: the smallest releases that give a bound close to the claim (no subsampling where
# the mechanism allows, a few mixtures); see docs/privacy.md, "Empirical audits".
_N = Key("n", int, "records in D and D′ (public)", required=False, default=2)
_T = Key("n_samples", int, "T: mixtures per release", required=False, default=4)
_RATIO = Key(
    "noise_ratio", float, "σ_y/σ_x (labels' noise over features')", required=False, default=1.0
)

MECHANISMS: dict[str, AuditedMechanism] = {
    m.name: m
    for m in (
        AuditedMechanism(
            name="dpmix",
            keys=(
                _N,
                Key("mixture_degree", int, "ℓ", required=False, default=2),
                _T,
                Key(
                    "assignment",
                    str,
                    "mixture or record",
                    required=False,
                    default="mixture",
                    choices=("mixture", "record"),
                ),
                _RATIO,
            ),
            neighbours=_unit_neighbours,
            preprocess=_unit_preprocess,
            function=dpmix.generate,
            run=runs.run_dpmix,
            rows=_dpmix_rows,
            claim_keys=lambda p: {
                "n": p["n"],
                "mixture_degree": p["mixture_degree"],
                "n_samples": p["n_samples"],
                "assignment": p["assignment"],
                "noise_ratio": p["noise_ratio"],
            },
        ),
        AuditedMechanism(
            name="dpcda",
            keys=(
                Key(
                    "n",
                    int,
                    "records, all of one class (= min_class_size)",
                    required=False,
                    default=2,
                ),
                Key("mixture_degree", int, "ℓ", required=False, default=2),
                _T,
                Key("clip_norm", float, "C", required=False, default=1.0),
            ),
            neighbours=_dpcda_neighbours,
            preprocess=_dpcda_preprocess,
            function=dpcda.generate,
            run=runs.run_dpcda,
            rows=lambda p: _fixed(
                p["mixture_degree"] / p["n"], 1 / p["mixture_degree"], displaces=True
            ),
            claim_keys=lambda p: {
                "n": p["n"],
                "mixture_degree": p["mixture_degree"],
                "n_samples": p["n_samples"],
                "clip_norm": p["clip_norm"],
                "n_classes": 1,
                "min_class_size": p["n"],
            },
            exact_labels=True,
        ),
        AuditedMechanism(
            name="sgdrm",
            keys=(
                _N,
                Key("mixture_width", int, "ℓ", required=False, default=1),
                Key("n_samples", int, "T: mixtures per release", required=False, default=1),
                # Small enough that nearly every coefficient sits at ±c, as the accountant's
                # worst case does (the service's default is 3/√ℓ).
                Key("coefficient_bound", float, "c", required=False, default=0.1),
            ),
            neighbours=_unit_neighbours,
            preprocess=_unit_preprocess,
            function=sgdrm.generate,
            run=runs.run_sgdrm,
            rows=_sgdrm_rows,
            claim_keys=lambda p: {
                "n": p["n"],
                "mixture_width": p["mixture_width"],
                "n_samples": p["n_samples"],
                "coefficient_bound": coefficient_bound(p),
            },
        ),
        AuditedMechanism(
            name="local_perturbation",
            keys=(_N, _RATIO),
            neighbours=_unit_neighbours,
            preprocess=_unit_preprocess,
            function=baselines.local_perturbation,
            run=runs.run_local,
            rows=lambda p: _fixed(1.0, 1.0, rows=1),
            claim_keys=lambda p: {"n": p["n"], "noise_ratio": p["noise_ratio"]},
        ),
        AuditedMechanism(
            name="random_projection",
            keys=(
                _N,
                Key("projection_dim", int, "d", required=False, default=N_FEATURES),
                Key("spectral_norm", float, "s", required=False, default=1.0),
                _RATIO,
            ),
            neighbours=_unit_neighbours,
            preprocess=_unit_preprocess,
            function=baselines.random_projection,
            run=runs.run_projection,
            rows=lambda p: _fixed(1.0, 1.0, rows=1),
            claim_keys=lambda p: {
                "n": p["n"],
                "projection_dim": p["projection_dim"],
                "spectral_norm": p["spectral_norm"],
                "noise_ratio": p["noise_ratio"],
            },
        ),
    )
}
