"""From distinguishing-test outcomes to a lower bound on ε (Jagielski, Ullman, Oprea, NeurIPS
2020; Nasr, Song, Thakurta, Papernot, Carlini, IEEE S&P 2021).

A test guesses D′ when its score exceeds a threshold t. With FPR = P[score > t | D] and
FNR = P[score ≤ t | D′], (ε, δ)-DP of the mechanism (both orders of the pair) implies

    1 − FNR ≤ e^ε·FPR + δ   and   1 − FPR ≤ e^ε·FNR + δ,

so ε ≥ max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR)). The rates are estimated from
independent trials; Clopper–Pearson upper bounds on FPR and FNR, each one-sided at level α/2,
hold together with probability ≥ 1 − α (union bound), and plugging them in gives an ε lower
bound that holds at confidence 1 − α.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import beta


def clopper_pearson_upper(errors: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided upper (1 − alpha) Clopper–Pearson bound on a rate from ``errors``/``trials``."""
    errors = np.asarray(errors, dtype=np.float64)
    upper = beta.ppf(1 - alpha, errors + 1, np.maximum(trials - errors, 1e-300))
    return np.where(errors >= trials, 1.0, upper)


def _bounds(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """log((1 − δ − FNR)/FPR) and log((1 − δ − FPR)/FNR); −inf where a numerator is ≤ 0,
    +inf where a rate is 0."""
    fpr, fnr = np.asarray(fpr, dtype=np.float64), np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.maximum(1 - delta - fnr, 0.0)) - np.log(fpr)
        two = np.log(np.maximum(1 - delta - fpr, 0.0)) - np.log(fnr)
    return np.nan_to_num(one, nan=-np.inf), np.nan_to_num(two, nan=-np.inf)


def epsilon_bound(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
    """max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR), 0)."""
    one, two = _bounds(fpr, fnr, delta)
    return np.maximum(np.maximum(one, two), 0.0)


@dataclass(frozen=True)
class Outcome:
    threshold: float
    trials: int  # per dataset
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    epsilon_lower_bound: float
    epsilon_point_estimate: float  # the same formula on the raw rates: no guarantee, inf at 0
    inequality: str  # the one of the two DP inequalities that gave the bound

    @property
    def fpr(self) -> float:
        return self.false_positives / self.trials

    @property
    def fnr(self) -> float:
        return self.false_negatives / self.trials


def _errors(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """False positives (D scored above t) and false negatives (D′ at or below t) per t."""
    below_d = np.searchsorted(np.sort(scores_d), thresholds, side="right")
    below_d_prime = np.searchsorted(np.sort(scores_d_prime), thresholds, side="right")
    return scores_d.size - below_d, below_d_prime


def evaluate(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, threshold: float, delta: float, alpha: float
) -> Outcome:
    """The bound of the fixed test "score > threshold" on these trials (as many per dataset)."""
    if scores_d.size != scores_d_prime.size:
        raise ValueError("the two datasets need the same number of trials")
    fp, fn = _errors(scores_d, scores_d_prime, np.array([threshold]))
    trials = scores_d.size
    fpr_upper = clopper_pearson_upper(fp, trials, alpha / 2)
    fnr_upper = clopper_pearson_upper(fn, trials, alpha / 2)
    one, two = _bounds(fpr_upper, fnr_upper, delta)
    return Outcome(
        threshold=float(threshold),
        trials=trials,
        false_positives=int(fp[0]),
        false_negatives=int(fn[0]),
        fpr_upper=float(fpr_upper[0]),
        fnr_upper=float(fnr_upper[0]),
        epsilon_lower_bound=float(epsilon_bound(fpr_upper, fnr_upper, delta)[0]),
        epsilon_point_estimate=float(epsilon_bound(fp / trials, fn / trials, delta)[0]),
        inequality="1 - FNR <= e^eps * FPR + delta"
        if one[0] >= two[0]
        else "1 - FPR <= e^eps * FNR + delta",
    )


def choose_threshold(
    scores_d: np.ndarray,
    scores_d_prime: np.ndarray,
    delta: float,
    alpha: float,
) -> float:
    """The threshold whose Clopper–Pearson ε bound is largest on these (selection) trials.

    Every pooled score is a candidate; the bound the best one gives here is optimistic
    (selected on the same data), which is why it is evaluated again on fresh trials."""
    thresholds = np.unique(np.concatenate([scores_d, scores_d_prime]))
    fp, fn = _errors(scores_d, scores_d_prime, thresholds)
    bounds = epsilon_bound(
        clopper_pearson_upper(fp, scores_d.size, alpha / 2),
        clopper_pearson_upper(fn, scores_d_prime.size, alpha / 2),
        delta,
    )
    return float(thresholds[int(np.argmax(bounds))])


def selected_and_evaluated(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, delta: float, alpha: float
) -> Outcome:
    """The threshold chosen on the first half of each dataset's trials (``choose_threshold``)
    and its bound on the second, fresh half (``evaluate``): an odd last trial is left out."""
    half = min(scores_d.size, scores_d_prime.size) // 2
    threshold = choose_threshold(scores_d[:half], scores_d_prime[:half], delta, alpha)
    return evaluate(
        scores_d[half : 2 * half], scores_d_prime[half : 2 * half], threshold, delta, alpha
    )
