"""The one place release noise is drawn, so every mechanism uses the same sampler."""

from __future__ import annotations

import torch


def add_noise(values: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """``values`` + N(0, σ²) on every entry, drawn from ``generator`` on their device."""
    noise = torch.randn(values.shape, generator=generator, device=values.device, dtype=values.dtype)
    return values + sigma * noise
