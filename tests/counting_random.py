"""A secure source that counts the keystream bytes it hands out, for tests that pin how much
randomness a sampler draws."""

from __future__ import annotations

import numpy as np

from dpcore.mechanisms.secure_random import SecureRandom


class CountingRandom(SecureRandom):
    """Counts the keystream bytes drawn (``used``)."""

    def __init__(self, seed: int) -> None:
        super().__init__(key=bytes([seed]) * 32)
        self.used = 0

    def fill(self, out: np.ndarray) -> np.ndarray:
        self.used += out.nbytes
        return super().fill(out)
