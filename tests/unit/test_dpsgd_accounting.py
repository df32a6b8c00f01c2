"""DP-SGD steps under replace-one (``dpcore.accounting.dpsgd``): the two-term curve B, the
discrete pair built from it, its composition, and the numerical worst cases it must cover."""

from __future__ import annotations

import math
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
from scipy import special

from dpcore.accounting import dpsgd, gdp, pld
from tests.unit.test_acc_sgdrm import _grid_delta

DELTA = 1e-5
# (q, a, Δ): DPGM-like (histogram and gradient), DP-KIP-like (Δ = 2a), SGDRM-like (Δ = √2a).
CASES = [
    (0.2, 0.064, 0.125),
    (0.0017, 0.73, 1.42),
    (0.01, 0.5, 1.0),
    (0.3, 1.0, 2.0),
    (0.05, 1.1, 1.55),
]


def _pmf_delta(step: pld.DiscretePLD, eps: np.ndarray) -> np.ndarray:
    """δ(ε) of a discrete pair from its PLD: Σ ω(l)(1 − e^{ε − l})_+ + ω_∞."""
    losses = (step.lower + np.arange(step.probs.size)) * step.interval
    gap = np.maximum(1.0 - np.exp(eps[:, None] - losses[None, :]), 0.0)
    return gap @ step.probs + step.infinity  # type: ignore[no-any-return]


def _antipodal_delta(q: float, r: float, eps: float) -> float:
    """δ(ε) of ((1 − q)N_0 + qN_{−r}, (1 − q)N_0 + qN_r) (noise 1), exactly: the loss decreases
    in x, so {p > e^ε q} is a half-line, found by bisection."""

    def loss(x: float) -> float:
        num = (1 - q) + q * math.exp(-r * x - r * r / 2)
        den = (1 - q) + q * math.exp(r * x - r * r / 2)
        return math.log(num / den)

    lo, hi = -60.0, 60.0
    if loss(lo) <= eps:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if loss(mid) > eps else (lo, mid)
    x = lo
    p = (1 - q) * special.ndtr(x) + q * special.ndtr(x + r)
    s = (1 - q) * special.ndtr(x) + q * special.ndtr(x - r)
    return float(max(p - math.exp(eps) * s, 0.0))


@pytest.mark.parametrize(("q", "a", "d"), CASES)
def test_two_term_pair_interpolates_b_and_lies_below_the_simple_pair(
    q: float, a: float, d: float
) -> None:
    h = 1e-3
    step = dpsgd.two_term_pmf(q, a, d, h, 1e-12)
    assert step is not None  # B's grid values are convex at these settings: no fallback
    assert np.all(step.probs >= 0) and 0 <= step.infinity < 1
    assert math.fsum(step.probs) + step.infinity == pytest.approx(1.0, abs=1e-12)
    grid = np.arange(0, 400) * h * 7
    b = dpsgd.step_curve(q, a, d, grid)
    top = (step.probs.size - 1) // 2 * h  # K·h: beyond it δ is the mass at +∞ (≥ B there)
    inside = grid <= top
    got = _pmf_delta(step, grid)
    np.testing.assert_allclose(got[inside], b[inside], rtol=1e-7, atol=1e-15)
    assert np.all(got[~inside] >= b[~inside])
    # Symmetric: δ(ε) = 1 − e^ε + e^ε·δ(−ε) for ε < 0.
    neg = -grid[1:50]
    np.testing.assert_allclose(
        _pmf_delta(step, neg), -np.expm1(neg) + np.exp(neg) * _pmf_delta(step, -neg), rtol=1e-9
    )
    # B is below (P*, Q*)'s curve of distance Δ̄ = max(a, Δ), and above the remove pair's of a.
    simple = np.asarray(dpsgd.step_hockey_stick(q, max(a, d), grid))
    assert np.all(b <= simple * (1 + 1e-12) + 1e-300)
    assert np.all(b >= np.asarray(pld.hockey_stick(q, 1 / a, grid)) * (1 - 1e-9))


@pytest.mark.parametrize(("q", "a", "d"), [(0.2, 0.5, 1.0), (0.05, 1.0, 2.0), (0.5, 0.7, 1.4)])
def test_discrete_pair_covers_every_feasible_pair_between_grid_points(
    q: float, a: float, d: float
) -> None:
    # The numerical worst-case checks (antipodal at full norm, and other angles and norms in
    # the plane) stay below the charged pair's curve, at grid points and between them.
    step = dpsgd.two_term_pmf(q, a, d, 0.05, 1e-12)  # a coarse grid: the chords matter
    assert step is not None
    for eps in (0.0, 0.03, 0.26, 0.61, 1.37):
        bound = float(_pmf_delta(step, np.array([eps]))[0])
        assert _antipodal_delta(q, a, eps) <= bound * (1 + 1e-9)
        for r1, r2, angle in [(1, 1, 180), (1, 1, 120), (1, 0.5, 180), (1, 0, 0), (0.6, 1, 90)]:
            u = (a * r1, 0.0)
            t = math.radians(angle)
            v = (a * r2 * math.cos(t), a * r2 * math.sin(t))
            if math.dist(u, v) > d + 1e-12:
                continue
            assert _grid_delta(q, u, v, eps) <= bound * (1 + 2e-3) + 1e-9, (r1, r2, angle, eps)


def test_at_q_one_it_is_the_gaussian() -> None:
    # q = 1: β = 1 and B = δ_G(Δ): T steps and a μ_G part are exactly √(TΔ² + μ_G²)-GDP.
    for T, d, mu in [(10, 0.3, 0.5), (100, 0.1, 0.0), (1, 1.0, 2.0)]:
        exact = gdp.epsilon_of(math.sqrt(T * d * d + mu * mu), DELTA)
        got = dpsgd.epsilon(
            sampling_prob=1.0, present=d / 2, replaced=d, steps=T, delta=DELTA, gaussian_mu=mu
        )
        assert exact <= got <= exact * (1 + 1e-3)


def test_composition_agrees_with_dp_accounting() -> None:
    # The same step PMF composed by dp_accounting's own self_compose and Gaussian PLD.
    q, a, d, T, mu = 0.02, 0.6, 1.2, 300, 0.4
    h = dpsgd._interval(q, d, T, DELTA, mu)
    step = dpsgd.two_term_pmf(q, a, d, h, pld.tail_level(DELTA, T))
    assert step is not None
    theirs = (
        step.pld()
        .self_compose(T)
        .compose(
            dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
                1.0, sensitivity=mu, value_discretization_interval=h
            )
        )
    )
    got = dpsgd.epsilon(
        sampling_prob=q, present=a, replaced=d, steps=T, delta=DELTA, gaussian_mu=mu
    )
    assert got == pytest.approx(theirs.get_epsilon_for_delta(DELTA), rel=1e-6)


def test_falls_back_to_the_simple_pair_when_b_is_not_convex_on_the_grid(
    monkeypatch: Any,
) -> None:
    def bumpy(q: float, a: float, d: float, eps: Any) -> np.ndarray:
        values = np.asarray(dpsgd.pld.hockey_stick(q, 1 / d, eps), dtype=float)
        values[1::2] *= 1.05  # a zigzag: some masses would be negative
        return values

    monkeypatch.setattr(dpsgd, "step_curve", bumpy)
    assert dpsgd.two_term_pmf(0.1, 0.5, 1.0, 1e-3, 1e-12) is None
    dpsgd._epsilon.cache_clear()
    try:
        got = dpsgd.epsilon(
            sampling_prob=0.1, present=0.5, replaced=1.0, steps=50, delta=DELTA, gaussian_mu=0.0
        )
    finally:
        dpsgd._epsilon.cache_clear()
    assert got == pytest.approx(pld.epsilon_of(0.1, 1.0, 50, DELTA), rel=1e-9)


def test_the_two_term_pair_is_much_tighter_at_moderate_noise() -> None:
    # Many small-q steps at z ≈ 1.4 (the paper's DPGM setting): B keeps the presence bound a.
    q, a, T = 0.0017, 1 / math.sqrt(2), 11_780
    two_term = dpsgd.epsilon(
        sampling_prob=q, present=a, replaced=2 * a, steps=T, delta=DELTA, gaussian_mu=0.0
    )
    simple = pld.epsilon_of(q, 1 / (2 * a), T, DELTA)
    assert two_term < 0.65 * simple


def test_rate_rounds_up() -> None:
    assert dpsgd.rate(3, 3) == 1.0
    for batch, n in [(1, 3), (2000, 10_000), (102, 60_000)]:
        assert dpsgd.rate(batch, n) >= batch / n
        assert dpsgd.rate(batch, n) <= (batch / n) * (1 + 1e-15)
    with pytest.raises(ValueError, match="batch"):
        dpsgd.rate(0, 5)
