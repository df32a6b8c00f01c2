"""Theorem 1 of Lee et al., "Synthesizing Differentially Private Datasets using Random
Mixing" (ISIT 2019), as printed: the RDP of one noisy mean of ℓ records drawn without
replacement, which the random-mixing mechanism and its local-perturbation baseline (read by
the paper as ℓ = 1) are both charged with by their ``paper`` accountants.

With p = ℓ/n (the printed binom(ℓ, n) is a typo), Δ² = d_X/σ_X² + d_Y/σ_Y² and the base
mechanism's RDP ε(α) = αΔ²/(2ℓ²),

    ε′_α = log(1 + p² C(α,2) min(4(e^{ε(2)} − 1), 2e^{ε(2)}) + 4 G(α)) / (α − 1),
    G(α) = Σ_{j=3}^{α} p^j C(α,j) √(B(2⌊j/2⌋) B(2⌈j/2⌉)),
    B(k) = Σ_{i=0}^{k} (−1)^i C(k,i) e^{i(i−1)Δ²/(2ℓ²)},
    ε = min_{α ∈ {2,…,256}} T ε′_α + log(1/δ)/(α − 1).

The printed min-term exponent e^{Δ²/2} is read as e^{ε(2)} = e^{Δ²/ℓ²}, as in the theorem it
applies (WBK Thm 27, the paper's Thm 4) and as in B's own exponent. B(k) is the k-th forward
difference of x ↦ e^{(x−1)ε(x)} at 0; it is evaluated in log space with signs by the same
stable scheme dp_accounting uses for WBK's bound (equivalently: a Gaussian with noise
multiplier z = ℓ/Δ, whose cgf is x(x+1)/(2z²)).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, logsumexp

from dpcore.accounting.wor_gaussian import forward_diff_logs

PAPER_MAX_ORDER = 256


def _log_comb(n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return np.asarray(
        gammaln(np.add(n, 1)) - gammaln(np.add(k, 1)) - gammaln(np.subtract(n, k) + 1)
    )


def theorem1_rdp(*, q: float, delta_sq_over_ell_sq: float) -> np.ndarray:
    """ε′_α for α = 2, …, 256 (index α − 2): one mixture's RDP per Theorem 1."""
    eps2 = delta_sq_over_ell_sq  # ε(2) = 2·Δ²/(2ℓ²)
    if eps2 == 0 or q == 0:
        return np.zeros(PAPER_MAX_ORDER - 1)
    z = 1.0 / math.sqrt(delta_sq_over_ell_sq)  # Gaussian with ε(α) = α/(2z²)
    log_b = forward_diff_logs(z, PAPER_MAX_ORDER)
    alphas = np.arange(2, PAPER_MAX_ORDER + 1)
    log_q = math.log(q) if q > 0 else -math.inf
    # j = 2 term: p² C(α,2) min(4(e^{ε(2)} − 1), 2e^{ε(2)}).
    log_min = min(math.log(4) + eps2 + math.log(-math.expm1(-eps2)), math.log(2) + eps2)
    term2 = 2 * log_q + _log_comb(alphas, 2) + log_min
    # j ≥ 3 terms: 4 p^j C(α,j) √(B(2⌊j/2⌋) B(2⌈j/2⌉)); B(k) sits at index k − 1 of log_b
    # (dp_accounting's layout, whose first entry is the value at x = −1).
    j = np.arange(3, PAPER_MAX_ORDER + 1)
    half = 0.5 * (log_b[2 * (j // 2) - 1] + log_b[2 * ((j + 1) // 2) - 1])
    per_j = math.log(4) + half + j * log_q
    out = np.empty(len(alphas))
    for index, alpha in enumerate(alphas):
        upto = j <= alpha
        terms = np.concatenate(
            ([0.0, term2[index]], per_j[upto] + _log_comb(float(alpha), j[upto]))
        )
        out[index] = logsumexp(terms) / (alpha - 1)
    return out


def theorem1_curve_epsilon(curve: np.ndarray, delta: float) -> float:
    """ε at δ of a composed Theorem 1 curve (T ε′_α for α = 2 … 256)."""
    alphas = np.arange(2, PAPER_MAX_ORDER + 1)
    return float(np.min(curve + math.log(1 / delta) / (alphas - 1)))
