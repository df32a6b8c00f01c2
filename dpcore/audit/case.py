"""What an empirical audit of a mechanism needs, and the pieces most audits share.

Every audit replaces record 0 (replace-one, n public) and makes the replaced record move the
release as far as the accountant's sensitivity allows. A mechanism's audit case (in its own
folder) gives the worst-case neighbours, the worker's preprocessing, the run of the real
mechanism function, and the row model of the distinguishing score.

Unit-scale mechanisms (features mapped to [0, 1], rows to L2 norm ≤ 1, one-hot labels) share
``unit_neighbours``: two records differ by at most √2; record 0 is ones on the first half of
the 8 features in D and ones on the second half in D′ (norm 2 before the norm scaling, 1
after: two orthogonal unit records, ‖x − x′‖ = √2), with label 1 in D and 2 in D′
(‖e₁ − e₂‖ = √2). The other records are all-zero features with label 0: they contribute
nothing along the canary's directions, whatever subset or coefficient they get.

Score: the log-likelihood ratio of D′ against D of a model of each released row: a row holds
record 0 with probability q, times a coefficient c of known law, plus the release's Gaussian
noise; rows are treated as independent. Where rows are independent given the data this is the
exact Neyman–Pearson statistic; elsewhere (coupled rows, discretised coefficient laws) it is an
approximation, which makes the test weaker, never the bound invalid: any score gives one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcore.audit.runs import Release, Run
from dpcore.preprocessing import unit_features

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
    # Declared standardisation and clip norm, where the mechanism uses them (else None).
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
class AuditCase:
    neighbours: Callable[[Mapping[str, Any]], Neighbours]
    preprocess: Preprocess  # what the worker does (the harness can swap it)
    # The dpcore mechanism function the worker runs for these params (the harness can wrap it).
    function: Callable[[Mapping[str, Any]], Callable[..., Any]]
    run: Callable[[Callable[..., Any], Run, Mapping[str, Any]], tuple[Release, Release]]
    rows: Callable[[Mapping[str, Any]], RowModel]
    claim_keys: Callable[[Mapping[str, Any]], dict[str, Any]]
    exact_labels: bool = False
    # The noise scale the released "labels" block carries, when it is not the one perturbing
    # labels (ClustMix scores its noisy cluster counts there).
    label_scale: str | None = None


# --- neighbours and preprocessing ------------------------------------------------------------


def records(params: Mapping[str, Any]) -> int:
    n = int(params["n"])
    if n < 2:
        raise ValueError("the audit needs n >= 2 (record 1 stands for the others)")
    return n


def unit_neighbours(params: Mapping[str, Any]) -> Neighbours:
    n = records(params)
    X = np.zeros((n, N_FEATURES))
    X_prime = X.copy()
    X[0, :HALF] = 1.0
    X_prime[0, HALF:] = 1.0
    labels = np.zeros(n, dtype=np.int64)
    labels_prime = labels.copy()
    labels[0], labels_prime[0] = 1, 2
    lo, hi = np.zeros(N_FEATURES), np.ones(N_FEATURES)
    return Neighbours(X, X_prime, labels, labels_prime, lo, hi, n_classes=3)


def unit_preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    return unit_features(X, nb.lo, nb.hi)


# --- row models ------------------------------------------------------------------------------


def fixed(
    inclusion: float, coefficient: float, rows: int | None = None, displaces: bool = False
) -> RowModel:
    return RowModel(inclusion, np.array([coefficient]), np.array([1.0]), rows, displaces)
