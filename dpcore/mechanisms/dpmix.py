"""DPMix (Lee et al., ISIT 2019): noisy means of ℓ records drawn uniformly without replacement.

Inputs are preprocessed (features in [0, 1] with L2 norm ≤ 1, one-hot labels), which is what
the accountant's sensitivity assumes. Mixtures are generated in chunks so memory stays bounded
for any ``n_samples``; every mixture draws its own subset independently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from dpcore.mechanisms.sampling import uniform_subsets

ProgressFn = Callable[[int], None]

# Gathered rows per chunk (chunk × ℓ × d floats): bounds memory at a few hundred MB.
_GATHER_BUDGET = 1 << 25


def chunk_size(*, mixture_degree: int, dim: int, n: int) -> int:
    by_gather = _GATHER_BUDGET // max(1, mixture_degree * dim)
    by_keys = _GATHER_BUDGET // max(1, n) if mixture_degree * mixture_degree > n else 1 << 16
    return max(1, min(4096, by_gather, by_keys))


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    mixture_degree: int,
    n_samples: int,
    sigma_x: float,
    sigma_y: float,
    generator: torch.Generator,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield chunks ``(X', Y')`` of noisy mixtures until ``n_samples`` rows were produced.

    ``features`` (n × d) and ``labels`` (n × k) must be preprocessed and on one device.
    """
    n, dim = features.shape
    if labels.shape[0] != n:
        raise ValueError("features and labels disagree on the number of records")
    device = features.device
    step = chunk_size(mixture_degree=mixture_degree, dim=dim + labels.shape[1], n=n)
    produced = 0
    while produced < n_samples:
        count = min(step, n_samples - produced)
        idx = uniform_subsets(n, mixture_degree, count, generator=generator, device=device)
        mixed_x = features[idx].mean(dim=1)
        mixed_y = labels[idx].mean(dim=1)
        noise_x = torch.randn(
            mixed_x.shape, generator=generator, device=device, dtype=mixed_x.dtype
        )
        noise_y = torch.randn(
            mixed_y.shape, generator=generator, device=device, dtype=mixed_y.dtype
        )
        yield mixed_x + sigma_x * noise_x, mixed_y + sigma_y * noise_y
        produced += count
