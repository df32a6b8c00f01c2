"""DPGM's public torch stream (reparametrisation draws) advances by the same amount whatever
the secret Poisson batches, and a record's draw does not depend on which others joined."""

from __future__ import annotations

import torch

from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpgm.models import VAE
from dpcore.mechanisms.secure_random import SecureRandom


def _identity(values: torch.Tensor, **_: object) -> torch.Tensor:
    return values


def _consumed(seed: int, batch: int) -> tuple[int, int]:
    """(public normals drawn, records the batches held) over a short training."""
    drawn = [0]
    public = torch.Generator().manual_seed(0)

    def normal(shape: tuple[int, ...]) -> torch.Tensor:
        out = torch.randn(shape, generator=public)
        drawn[0] += out.numel()
        return out

    joined = [0]

    class Counting(SecureRandom):
        def bernoulli(self, k: int, m: int, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
            chosen = super().bernoulli(k, m, shape)
            joined[0] += int(chosen.sum())
            return chosen

    net = VAE(d=4, hidden=3, latent=2)
    params = net.init(2, normal)
    start = drawn[0]
    settings = dpsgd.SGDSettings(
        steps=5, batch=batch, sigma=1.0, sigma_norm=1.0, clip_max=1.0, bins=4, lr=1e-3
    )
    n = 40
    dpsgd.train(
        net,
        params,
        torch.rand((n, 4)),
        torch.arange(n) % 2,
        torch.tensor([20.0, 20.0]),
        settings,
        sampler=_identity,
        generator=Counting(key=seed.to_bytes(32, "little")),
        normal=normal,
        uniform=lambda shape: torch.rand(shape, generator=public),
    )
    return drawn[0] - start, joined[0]


def test_the_public_stream_does_not_follow_the_batch_sizes() -> None:
    runs = [_consumed(seed, batch) for seed, batch in ((1, 5), (2, 5), (3, 30))]
    # Different secret batches (sizes differ), the same public consumption: n·latent a step.
    assert len({joined for _, joined in runs}) == 3
    assert {drawn for drawn, _ in runs} == {5 * 40 * 2}


def test_a_records_public_draw_does_not_depend_on_the_others() -> None:
    def normal_from(seed: int):  # type: ignore[no-untyped-def]
        generator = torch.Generator().manual_seed(seed)
        return lambda shape: torch.randn(shape, generator=generator)

    few = dpsgd.per_record(normal_from(4), 10, torch.tensor([1, 7]))((2, 3))
    many = dpsgd.per_record(normal_from(4), 10, torch.tensor([0, 1, 5, 7]))((4, 3))
    assert torch.equal(few, many[[1, 3]])
