"""What a map or reduce task needs besides its data: its own secure source and its noise.

Every task that draws randomness draws it from its own ``SecureRandom``: in a release a fresh
256-bit OS key made *on the worker that runs the task* (``FreshKeys``), so no key crosses the
network or the scheduler; in tests a key derived from a public seed and the task's name
(``SeededKeys``), so a run is reproducible. Streams under independent keys are independent
(ChaCha20 as a PRF), so the draws of different tasks are independent, exactly as the draws
of one stream at different offsets are in the single-machine generators.

A task rebuilds its noise sampler from ``NoiseSpec``: the sampler's name and the release's
declared ``NoiseDescription``, wrapped in ``DeclaredNoise`` exactly as ``dpcore.mechanisms.
run.build`` wraps the single-machine sampler: a call with an undeclared σ or a larger
sensitivity raises ``UndeclaredNoise`` on the worker.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from dpcore.accounting.events import NoiseDescription
from dpcore.mechanisms import noise
from dpcore.mechanisms.noise import DeclaredNoise, NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom


class TaskKeys(Protocol):
    def source(self, task: str) -> SecureRandom:
        """The secure source of the task named ``task`` (names are unique within a job)."""
        ...


@dataclass(frozen=True)
class FreshKeys:
    """Release jobs: a fresh OS key per task, drawn where the task runs (never shipped)."""

    def source(self, task: str) -> SecureRandom:
        return SecureRandom()


@dataclass(frozen=True)
class SeededKeys:
    """Tests and benches only: a public key per (seed, task). Never for a release."""

    seed: int

    def source(self, task: str) -> SecureRandom:
        digest = hashlib.sha256(f"{self.seed}:{task}".encode()).digest()
        return SecureRandom.from_seed(int.from_bytes(digest[:8], "little"))


class NoiseFactory(Protocol):
    def build(self, source: SecureRandom) -> NoiseSampler: ...


@dataclass(frozen=True)
class NoiseSpec:
    """The release's sampler (``secure`` or ``fast``) restricted to its declared noise."""

    sampler: str
    declared: NoiseDescription

    def build(self, source: SecureRandom) -> NoiseSampler:
        return DeclaredNoise(noise.sampler(self.sampler, source), self.declared)
