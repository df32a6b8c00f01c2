"""DPGM's floating-point cover: each family declares the distance rounding can add to a step's
noised sums (``rounding_error``), the step hands exactly that to the sampler, and the clipped
norm's excess ``clipped_norm_excess`` holds at the worst rounding its hypothesis allows."""

from __future__ import annotations

from typing import Any

import mpmath as mp
import numpy as np
import pytest
import torch

from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpgm.models import RBM, VAE, clipped_norm_excess
from dpcore.mechanisms.secure_random import SecureRandom

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("relative", [0.0, 1e-10])
@pytest.mark.parametrize("absolute", [0.0, 1e-6, 1e-3])
def test_a_clipped_gradient_stays_within_the_excess_at_the_worst_rounding(
    relative: float, absolute: float
) -> None:
    """The hypothesis ‖g‖² ≤ (sq + absolute)/(1 − relative) taken at its edge, the square root
    rounded down by (1 − u) and C/ñ rounded up by (1 + u): ‖f·g‖ ≤ C(1 + η) for every C ≥
    C_min, whether the clip is active or not."""
    mp.mp.prec = 200  # the simulation itself exact to far below u
    u = mp.mpf(2) ** -53
    clip_min = 0.05
    eta = clipped_norm_excess(relative=relative, absolute=absolute, clip_min=clip_min)
    worst = mp.mpf(0)
    for clip in (mp.mpf(c) for c in np.geomspace(clip_min, 10.0, 25)):
        for true in (mp.mpf(t) for t in np.geomspace(1e-6, 100.0, 200)):
            sq = max(true**2 * (1 - mp.mpf(relative)) - mp.mpf(absolute), mp.mpf(0))
            computed = mp.sqrt(sq) * (1 - u)
            factor = mp.mpf(1) if computed == 0 else min(mp.mpf(1), clip / computed * (1 + u))
            worst = max(worst, factor * true / clip - 1)
    assert worst <= eta
    # The bound is not loose by more than the rounding's own size: dropping the absolute term
    # (the cancellation of the RBM's expansion) would not cover it.
    if absolute:
        assert worst > clipped_norm_excess(relative=relative, absolute=0.0, clip_min=clip_min)
    assert worst > eta / 2 - 16 * u  # and not loose by more than a factor 2


def test_the_rbm_declares_its_expansion_and_the_vae_its_sums() -> None:
    vae, rbm = VAE(784, 200, 20), RBM(784, 200)
    n, delta = 10_000, dpsgd.GRADIENT_SENSITIVITY
    # The VAE's norms are sums of non-negative terms: its cover is the sums' (≈ n²u) and
    # hardly depends on C_min.
    assert vae.rounding_error(n, 0.04, delta) >= dpsgd.rounding_error(n)
    assert vae.rounding_error(n, 0.04, delta) == pytest.approx(dpsgd.rounding_error(n), rel=0.01)
    # The RBM's expansion cancels terms of size dh: its cover grows as C_min shrinks.
    wide, narrow = rbm.rounding_error(n, 1.0, delta), rbm.rounding_error(n, 0.04, delta)
    assert narrow > 10 * wide > 10 * dpsgd.rounding_error(n)


@pytest.mark.parametrize("family", ["vae", "rbm"])
def test_each_step_hands_the_sampler_its_familys_cover(family: str) -> None:
    n, d = 40, 6
    net: Any = VAE(d, 5, 2) if family == "vae" else RBM(d, 5, chains=4)
    gen = torch.Generator().manual_seed(2)

    def normal(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    def uniform(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.rand(shape, generator=gen, dtype=torch.float64)

    seen: list[float] = []

    def recording(values: torch.Tensor, **kw: Any) -> torch.Tensor:
        if kw.get("sensitivity") == dpsgd.GRADIENT_SENSITIVITY:
            seen.append(kw["error"])
        return values

    recording.name = "recording"  # type: ignore[attr-defined]
    settings = dpsgd.SGDSettings(
        steps=2, batch=10, sigma=1.0, sigma_norm=1.0, clip_max=0.5, bins=5, lr=1e-3
    )
    X = torch.rand((n, d), generator=gen, dtype=torch.float64)
    params = {k: v.double() for k, v in net.init(2, normal).items()}
    dpsgd.train(
        net, params, X, torch.arange(n) % 2, torch.full((2,), n / 2.0), settings,
        sampler=recording, generator=SecureRandom.from_seed(1), normal=normal, uniform=uniform,
    )  # fmt: skip
    expected = net.rounding_error(n, 0.5 / 5, dpsgd.GRADIENT_SENSITIVITY)
    assert seen == [expected, expected]
