"""bench/dpsgd_cnn.py: the Poisson sampler's inclusion law is the rate the accountant is given,
the noise calibration never over-spends, and each row's gradient is clipped to norm C
before the sum."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from bench import dpsgd_cnn
from dpcore.accounting import dpsgd
from dpcore.mechanisms.secure_random import SecureRandom


def test_mask_is_bernoulli_at_the_rate_the_accountant_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n, batch, draws = 40, 10, 4000
    source = SecureRandom.from_seed(0)
    masks = np.stack([dpsgd_cnn.poisson_mask(source, batch, n) for _ in range(draws)])
    assert masks.shape == (draws, n) and masks.dtype == bool
    # Every row at rate batch/n (5σ of a Binomial(draws, 1/4) mean), the batch size variable
    # with Binomial(n, 1/4)'s spread, and rows included independently of each other.
    p = batch / n
    sd = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(masks.mean(0) - p) < 5 * sd)
    sizes = masks.sum(1)
    assert sizes.var() == pytest.approx(n * p * (1 - p), rel=0.15)
    assert abs(np.corrcoef(masks[:, 0], masks[:, 1])[0, 1]) < 5 / np.sqrt(draws)

    seen: dict[str, Any] = {}

    def spy(**kwargs: Any) -> float:
        seen.update(kwargs)
        return 1.0

    monkeypatch.setattr(dpsgd, "epsilon", spy)
    dpsgd_cnn.charged_epsilon(3.0, batch, n, steps=7)
    # The accountant's q: the sampler's exact batch/n rounded up (never below it), and the
    # replace-one bounds of a clipped sum with noise std zC.
    assert seen["sampling_prob"] == dpsgd.rate(batch, n) >= batch / n
    assert seen["sampling_prob"] == np.nextafter(batch / n, 1.0)
    assert (seen["present"], seen["replaced"], seen["steps"]) == (1 / 3.0, 2 / 3.0, 7)


@pytest.mark.parametrize(("epsilon", "steps"), [(1.0, 160), (30.0, 10)])  # z above 1, below 1
def test_noise_is_the_smallest_within_the_target(epsilon: float, steps: int) -> None:
    n, batch = 8000, 1000
    z = dpsgd_cnn.calibrate(epsilon, batch, n, steps)
    assert dpsgd_cnn.charged_epsilon(z, batch, n, steps) <= epsilon
    assert dpsgd_cnn.charged_epsilon(z * (1 - 2e-3), batch, n, steps) > epsilon


def test_each_rows_gradient_is_clipped_to_norm_clip() -> None:
    torch.manual_seed(0)
    # A small network: the clip is per row over all parameters, whatever the layers.
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 8), torch.nn.Tanh(), torch.nn.Linear(8, 10)
    )
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    x, y = torch.randn(3, 1, 28, 28), torch.tensor([1, 2, 3])
    clip = 1e-3  # below every row's gradient norm: each row contributes exactly norm C
    total = dpsgd_cnn.clipped_sum(dpsgd_cnn._per_example(net), params, x, y, clip)
    expected = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(3):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x[i : i + 1]), y[i : i + 1]).backward()
        grads = {k: v.grad for k, v in net.named_parameters() if v.grad is not None}
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        assert norm > clip
        for k, g in grads.items():
            expected[k] += g * (clip / norm)
    for k, g in total.items():
        torch.testing.assert_close(g, expected[k], rtol=1e-4, atol=1e-9)
