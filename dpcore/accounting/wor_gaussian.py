"""Fast RDP of the Gaussian mechanism under sampling without replacement (replace-one, n public).

This is a numpy re-implementation of the bound that dp_accounting computes in
``rdp_privacy_accountant._compute_rdp_sample_wor_gaussian``: Theorem 27 of Wang, Balle and
Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical Moments Accountant"
(AISTATS 2019, arXiv:1808.00087), with dp_accounting's cap terms. For an integer order α it
bounds the log-moment

    log A_α = log(1 + Σ_{i=2..α} C(α, i) q^i · T_i),

    T_2 = min(4 (e^{ε(2)} − 1), 2 e^{ε(2)}),                  ε(α) = α / (2σ²)
    T_i = min(4 · sqrt(|Δ^{2⌊i/2⌋} v| · |Δ^{2⌈i/2⌉} v|), 2 e^{cgf(i−1)})   for i ≥ 3,

where cgf(x) = x (x + 1) / (2σ²) and Δ^k v is the k-th forward difference at 0 of
v_m = exp(cgf(m − 1)), computed in log space. Above α = 256 dp_accounting drops the difference
term and keeps only the cap 2 e^{cgf(i−1)}; a fractional α linearly interpolates log A at ⌊α⌋
and ⌈α⌉ (WBK Corollary 10). The RDP is log A_α / (α − 1).

Why re-implement: dp_accounting recomputes all forward differences for every order in scalar
Python (O(α²) per order; its timing: docs/results/implementation.md). The differences do not
depend on α, so they are computed once, up to the largest order needed, and each pass of
dp_accounting's in-place difference loop is one vector operation (entry j is only written after
entries j and j + 1 of the previous pass were read). The per-order sums are one log-sum-exp
over an (orders × i) matrix.

Why it is bit-faithful where it matters: for large σ the high-order differences are pure
rounding noise in dp_accounting (differences of nearly equal numbers, amplified pass after
pass), and that noise reaches the result whenever it is smaller than the cap. A ledger must
never under-report, so this module reproduces dp_accounting's floating-point operations
exactly: the same formulas in the same order, ``np.exp`` where it uses ``np.exp``, and libm's
``math.log1p``/``math.exp`` (applied elementwise) where it uses them — numpy's vectorised
``log1p`` differs from libm's in the last bit, which the difference passes amplify to O(1)
errors in log space. The forward differences are then identical to dp_accounting's bit for bit;
only the final log-sum-exp rounds differently (relative error ~1e-15).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln

__all__ = ["MAX_EXACT_ORDER", "MAX_FINITE_ORDER", "log_moments_int", "rdp_wor_gaussian"]

#: dp_accounting's ``max_alpha``: integer orders up to this use the full Theorem 27 bound.
MAX_EXACT_ORDER = 256
#: Largest finite order accepted (the cap-only path is O(α) memory); pass ``inf`` beyond it.
MAX_FINITE_ORDER = 2**20

_LOG2 = np.log(2)
_LOG4 = np.log(4)


def _libm_log1p(x: np.ndarray) -> np.ndarray:
    # libm's log1p elementwise: dp_accounting's ``_log_sub_sign``/``_log_add`` call
    # ``math.log1p``, which is not bitwise equal to numpy's SIMD ``np.log1p``; the difference
    # passes amplify that last bit (see the module docstring). Raises ValueError at x ≤ −1.
    return np.fromiter(map(math.log1p, x.tolist()), float, x.size)


def _libm_exp(x: np.ndarray) -> np.ndarray:
    # ``math.exp`` elementwise, as in dp_accounting's ``_log_add`` (``np.exp`` differs too).
    return np.fromiter(map(math.exp, x.tolist()), float, x.size)


def _cgf(x: np.ndarray | float, sigma: float) -> np.ndarray | float:
    # dp_accounting's cgf(x) = rdp(x + 1) · x, written exactly as there.
    return x * 1.0 * (x + 1) / (2.0 * sigma**2)


def forward_diff_logs(sigma: float, k_max: int) -> np.ndarray:
    """``deltas[0..k_max]`` of dp_accounting's ``_get_forward_diffs(cgf, n)`` for any n ≥ k_max.

    deltas[k] is log|Δ^{k+1} x| at 0 for x = (1, e^{cgf(0)}, e^{cgf(1)}, …), computed by k + 1
    passes of ``_stable_inplace_diff_in_log``. It depends only on x_0..x_{k+1}, so one
    computation serves every order; pass k needs only entries 0..k_max − k. Each pass is one
    vector step: entry j becomes log|x_{j+1} − x_j| (same signs, ``_log_sub_sign``) or
    log(|x_j| + |x_{j+1}|) (different signs, ``_log_add``), with dp_accounting's formulas,
    operand order and functions, so the result is bitwise identical to its ``deltas``.

    In exact arithmetic every difference is positive (e^{cgf} is a Gaussian mixture of
    exponentials), so the sign bookkeeping is skipped while all signs are positive and
    x increases; with large σ (≳ 10) rounding noise flips signs in the high passes, and the
    general branch reproduces dp_accounting's handling of them.
    """
    x = np.arange(-1.0, k_max + 1.0)  # x_m = exp(cgf(m − 1)), m = 0..k_max + 1
    v = np.asarray(_cgf(x, sigma), dtype=float)  # log |x_m|
    v[0] = 0.0  # dp_accounting's func_vec[0] = 0 (log 1); cgf(−1) would give −0.0
    signs: np.ndarray | None = None  # sign of x_m; None while all are positive
    deltas = np.empty(k_max + 1)
    with np.errstate(all="ignore"):
        for k in range(k_max + 1):
            a, b = v[:-1], v[1:]
            if signs is None:
                # Common case, _log_sub_sign's first branch: log x_{j+1} + log1p(−x_j/x_{j+1}).
                t = np.exp(a - b)
                np.negative(t, out=t)
                try:
                    v = b + _libm_log1p(t)
                except ValueError:  # some x_{j+1} ≤ x_j: redo this pass with the full logic
                    signs = np.ones(v.size, dtype=bool)
                else:
                    deltas[k] = v[0]
                    continue
            s_b = signs[1:]
            same = signs[:-1] == s_b
            d = a - b
            lt = same & (d > 0)  # _log_sub_sign's second branch: the difference is negative
            neg_gap = np.abs(d)
            np.negative(neg_gap, out=neg_gap)  # log-ratio of the smaller to the larger: lo − hi
            t = np.exp(neg_gap)
            np.negative(t, out=t, where=same)  # same signs: log1p(−e^{lo−hi})
            if not same.all():  # different signs: _log_add's math.log1p(math.exp(lo − hi))
                idx = np.flatnonzero(~same)
                t[idx] = _libm_exp(neg_gap[idx])
            equal = t == -1.0  # _log_sub_sign's `else` branch (x_j = x_{j+1}): log 0
            any_equal = bool(equal.any())
            if any_equal:
                t[equal] = 0.0
            log1p_t = _libm_log1p(t)
            if lt.any():  # that branch calls np.log1p, not math.log1p
                log1p_t[lt] = np.log1p(t[lt])
            v = np.maximum(a, b) + log1p_t
            if any_equal:
                v[equal] = -np.inf
            signs = s_b ^ lt  # a negative difference flips the sign
            if signs.all():
                signs = None
            deltas[k] = v[0]
    return deltas


def _log_f2m1(f2: float) -> float:
    """log(e^{ε(2)} − 1) written as dp_accounting does (including its rounding)."""
    e = np.exp(-f2)
    if e < 1.0:
        return float(f2 + math.log1p(-e))
    # σ ≳ 1e8: dp_accounting's math.log1p(−1.0) raises; use the accurate form instead.
    return float(f2 + np.log(-np.expm1(-f2)))


def _log_moments(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """dp_accounting's ``_compute_rdp_sample_wor_gaussian_int(q, σ, α)`` for integer α ≥ 0.

    Requires 0 < q ≤ 1 and σ > 0.
    """
    alphas = np.asarray(alphas, dtype=np.int64)
    out = np.zeros(alphas.shape, dtype=float)  # α ≤ 1: the empty sum, log 1 = 0
    if alphas.size == 0 or alphas.max() < 2:
        return out
    log_q = np.log(q)
    f2 = 1.0 * 2.0 / (2.0 * sigma**2)  # func(2.0)
    # Term i = 2 without its coefficient: min(log 4 + log(e^{ε(2)} − 1), ε(2) + log 2).
    t2 = np.minimum(_LOG4 + _log_f2m1(f2), f2 + _LOG2)
    a_max = int(alphas.max())
    log_fact = gammaln(np.arange(a_max + 2, dtype=float))  # log_fact[n] = log Γ(n) = log (n−1)!

    exact = (alphas >= 2) & (alphas <= MAX_EXACT_ORDER)
    if exact.any():
        a_ex = alphas[exact]
        top = int(a_ex.max())
        i = np.arange(2, top + 1)
        # Per-i factor, independent of α: T_2, and for i ≥ 3 the min of the difference term and
        # the cap (dp_accounting's delta_lo/delta_hi indices 2⌊i/2⌋ − 1 and 2⌈i/2⌉ − 1).
        deltas = forward_diff_logs(sigma, 2 * ((top + 1) // 2) - 1)
        lo = deltas[np.maximum(2 * (i // 2) - 1, 0)]
        hi = deltas[np.maximum(2 * ((i + 1) // 2) - 1, 0)]
        with np.errstate(invalid="ignore"):
            t_i = np.minimum(_LOG4 + 0.5 * (lo + hi), _LOG2 + _cgf(i - 1, sigma))
        out[exact] = _sum_terms(a_ex, i, log_q, log_fact, t2, t_i[1:], cap_only=False, sigma=sigma)
    for idx in np.flatnonzero(alphas > MAX_EXACT_ORDER):
        alpha = int(alphas[idx])
        i = np.arange(2, alpha + 1)
        out[idx] = _sum_terms(
            np.array([alpha]), i, log_q, log_fact, t2, None, cap_only=True, sigma=sigma
        )[0]
    return out


def _sum_terms(
    a: np.ndarray,
    i: np.ndarray,
    log_q: float,
    log_fact: np.ndarray,
    t2: float,
    t_rest: np.ndarray | None,
    *,
    cap_only: bool,
    sigma: float,
) -> np.ndarray:
    """log(1 + Σ_{i=2..α} exp(s_i)) for each α in ``a``, over the columns ``i`` = 2, 3, ….

    dp_accounting accumulates ``log_a = 0`` then ``_log_add(log_a, s_i)`` term by term; this
    is the same sum as one log-sum-exp (with log1p, so tiny moments keep full relative
    precision).
    """
    A = a[:, None]
    I = i[None, :]  # noqa: E741
    valid = I <= A
    k = np.where(valid, I, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # _log_comb(α, i) = gammaln(α+1) − gammaln(i+1) − gammaln(α−i+1), in that order.
        log_comb = log_fact[A + 1] - log_fact[k + 1] - log_fact[np.where(valid, A - k, 0) + 1]
        s = np.empty(log_comb.shape)
        s[:, 0] = 2 * log_q + log_comb[:, 0] + t2
        if cap_only:
            s[:, 1:] = _LOG2 + _cgf(I[:, 1:] - 1, sigma) + I[:, 1:] * log_q + log_comb[:, 1:]
        else:
            assert t_rest is not None
            s[:, 1:] = t_rest[None, :] + (I[:, 1:] * log_q + log_comb[:, 1:])
        s[~valid] = -np.inf
        # Factor out the largest of the terms and the leading 1 and sum the rest with log1p.
        top = s.argmax(axis=1)
        rows = np.arange(s.shape[0])
        s_top = s[rows, top]
        pos = s_top > 0  # the largest is a term, not the leading 1
        m = np.where(pos, s_top, 0.0)
        e = np.exp(s - m[:, None])
        e[rows[pos], top[pos]] = np.exp(-m[pos])  # swap the largest term for the 1
        res = m + np.log1p(e.sum(axis=1))
    return np.where(np.isnan(res), np.inf, res)


def log_moments_int(q: float, noise_multiplier: float, max_order: int) -> np.ndarray:
    """Log-moment bounds log A_α for α = 0, 1, …, max_order (index α).

    Entry α equals dp_accounting's ``_compute_rdp_sample_wor_gaussian_int(q, σ, α)`` (so the RDP
    at integer α ≥ 2 is entry α / (α − 1)). Entries 0 and 1 are 0 (log 1).
    """
    _check_q_sigma(q, noise_multiplier)
    if isinstance(max_order, bool) or int(max_order) != max_order or max_order < 0:
        raise ValueError(f"max_order must be a non-negative integer, got {max_order!r}")
    if max_order > MAX_FINITE_ORDER:
        raise ValueError(f"max_order must be at most {MAX_FINITE_ORDER}, got {max_order}")
    alphas = np.arange(int(max_order) + 1)
    if q == 0:
        return np.zeros(alphas.size)
    if noise_multiplier == 0 or 2.0 * noise_multiplier**2 == 0:
        return np.where(alphas >= 2, np.inf, 0.0)
    return _log_moments(q, noise_multiplier, alphas)


def _check_q_sigma(q: float, noise_multiplier: float) -> None:
    if not 0 <= q <= 1:  # also rejects NaN
        raise ValueError(f"sampling proportion q must be in [0, 1], got {q!r}")
    if not 0 <= noise_multiplier < math.inf:
        raise ValueError(f"noise_multiplier must be finite and ≥ 0, got {noise_multiplier!r}")


def rdp_wor_gaussian(
    q: float, noise_multiplier: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """RDP of the sampled-without-replacement Gaussian mechanism at each order.

    Same values as dp_accounting's ``_compute_rdp_sample_wor_gaussian(q, noise_multiplier,
    orders)`` (q = m/n, noise_multiplier = σ / ℓ2-sensitivity), as a float array; inf where it
    returns inf. Where dp_accounting raises instead of answering, this returns the conservative
    value:

    - ``noise_multiplier == 0`` (or so small that 2σ² underflows) with q > 0: inf;
    - order 1 with 0 < q < 1 (dp_accounting divides 0 by 0): the limit of its curve as α ↓ 1,
      which is its value on (1, 2), log A_2 — a valid bound since RDP is non-decreasing in α.

    Raises ValueError unless 0 ≤ q ≤ 1, 0 ≤ noise_multiplier < inf and every order is ≥ 1 and
    either ≤ ``MAX_FINITE_ORDER`` or inf.
    """
    _check_q_sigma(q, noise_multiplier)
    alpha = np.asarray(orders, dtype=float)
    if alpha.ndim != 1:
        raise ValueError(f"orders must be a 1-D sequence, got shape {alpha.shape}")
    if not np.all(alpha >= 1):  # also rejects NaN
        raise ValueError("every order must be ≥ 1")
    finite = np.isfinite(alpha)
    if np.any(alpha[finite] > MAX_FINITE_ORDER):
        raise ValueError(f"finite orders must be at most {MAX_FINITE_ORDER} (use inf beyond)")
    sigma = float(noise_multiplier)

    if q == 0:
        return np.zeros(alpha.size)
    if sigma == 0 or 2.0 * sigma**2 == 0:
        return np.full(alpha.size, np.inf)
    if q == 1:
        # No amplification: the Gaussian mechanism's own RDP α / (2σ²).
        return alpha / (2 * sigma**2)

    result = np.full(alpha.size, np.inf)  # infinite orders stay inf
    af = alpha[finite]
    lo = np.floor(af)
    hi = np.ceil(af)
    needed = np.unique(np.concatenate([lo, hi, [2.0]])).astype(np.int64)
    log_a = _log_moments(q, sigma, needed)
    x = log_a[np.searchsorted(needed, lo)]
    y = log_a[np.searchsorted(needed, hi)]
    t = af - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        # Integer α: log A_α / (α − 1). Fractional α: WBK Corollary 10, the CGF (α − 1)·RDP is
        # convex in α, so interpolating it linearly between ⌊α⌋ and ⌈α⌉ is an upper bound.
        vals = np.where(lo == hi, x / (af - 1), ((1 - t) * x + t * y) / (af - 1))
    vals[af == 1] = log_a[np.searchsorted(needed, 2)]
    result[finite] = vals
    return result
