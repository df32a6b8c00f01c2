"""Drawn records out of a marginal-based release: the post-processing generator and the
chunks the worker's row chain takes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import one_hot

CHUNK_ROWS = 1 << 16


def post_rng(generator: SecureRandom) -> np.random.Generator:
    """Post-processing randomness (bins, merged values, record draws), seeded from the
    release's secure source."""
    return np.random.default_rng([int(w) for w in generator.words(4)])


def chunks(
    unit: np.ndarray, labels: np.ndarray, classes: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Records (features in [0, 1], class indices) as (features, one-hot labels) chunks."""
    for start in range(0, len(unit), CHUNK_ROWS):
        stop = min(len(unit), start + CHUNK_ROWS)
        x = torch.as_tensor(unit[start:stop], dtype=torch.float32, device=device)
        y = torch.as_tensor(
            one_hot(labels[start:stop], classes), dtype=torch.float32, device=device
        )
        yield x, y
