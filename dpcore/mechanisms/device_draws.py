"""The rounded Gaussian's table draws in torch, on the device of the words they read.

``RoundedGaussian.draw`` maps each 64-bit stream word to a draw with a guide-table gather, then
for the draws in marked buckets a count of thresholds at or below the word's 63 bits ``h``, and
for the rare draw still undecided (h within 2E of a threshold, about 2⁻³⁵ of the draws) a
certified comparison reading further words. ``table_draws`` computes the same function of the
words on any torch device: the gather and the counts there, the undecided draws handed back to
be finished on the CPU by the same ``RoundedGaussian.exact_magnitude``, in the same order.

torch has no unsigned 64-bit comparisons on every device, so the table's thresholds (unsigned,
up to 2⁶⁴ − 1) are held as u − 2⁶³ in int64, and h (< 2⁶³) as h − 2⁶³: subtracting 2⁶³ from
both sides preserves every comparison and cannot overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from dpcore.mechanisms.rounded_gaussian import (
    BLOCK,
    GUIDE_MARK,
    HEAD_BITS,
    TABLE_ERROR,
    RandomBytes,
    RoundedGaussian,
)
from dpcore.mechanisms.secure_random import SecureRandom

_MIN = -(1 << 63)
# Blocks of words computed at once by ``lattice_noise`` (2²¹ words, 16 MiB).
SPAN_BLOCKS = 64
_HEAD_MASK = (1 << HEAD_BITS) - 1


@dataclass(frozen=True)
class _DeviceTable:
    guide: torch.Tensor  # int32, as RoundedGaussian's
    lowest: torch.Tensor  # int64
    thresholds: torch.Tensor  # int64: the unsigned thresholds − 2⁶³
    guide_bits: int
    size: int


@lru_cache(maxsize=8)
def _device_table(scale: float, device: torch.device) -> _DeviceTable:
    sampler = RoundedGaussian(scale)
    table = sampler.table
    shifted = (table.thresholds ^ np.uint64(1 << 63)).view(np.int64)
    return _DeviceTable(
        torch.from_numpy(table.guide).to(device),
        torch.from_numpy(table.lowest.astype(np.int64)).to(device),
        torch.from_numpy(shifted).to(device),
        table.guide_bits,
        sampler.size,
    )


@dataclass(frozen=True)
class Draws:
    """``values``: the signed draws (int64, on the words' device), 0 where undecided;
    ``undecided``: their indices, ascending, on the CPU, with their words and their count of
    thresholds at or below h (``first``), which ``finish`` needs."""

    values: torch.Tensor
    undecided: np.ndarray
    words: np.ndarray
    first: np.ndarray


def table_draws(sampler: RoundedGaussian, words: torch.Tensor) -> Draws:
    """``sampler.draw(words)`` on the words' device (int64 words: the stream's bits), except
    that the undecided draws are left for ``finish``."""
    table = _device_table(sampler.scale, words.device)
    bits = table.guide_bits
    # The sign and the top guide_bits bits of h: the top bits + 1 of the word, unsigned.
    index = (words >> (63 - bits)) & ((1 << (bits + 1)) - 1)
    values = table.guide[index].to(torch.int64)
    marked = torch.nonzero(values == int(GUIDE_MARK)).reshape(-1)
    empty = np.empty(0, dtype=np.int64)
    if not marked.numel():
        return Draws(values, empty, empty, empty)
    marked_words = words[marked]
    head = (marked_words & _HEAD_MASK) + _MIN
    lowest = table.lowest[index[marked] & ((1 << bits) - 1)]
    crowded = lowest < 0
    lowest = lowest.clamp(min=0)
    first = lowest + (table.thresholds[lowest] <= head) + (table.thresholds[lowest + 1] <= head)
    if bool(crowded.any()):
        search = torch.searchsorted(table.thresholds[: table.size], head, right=True)
        first = torch.where(crowded, search, first)
    # Decided: F(first) > V is certain (RoundedGaussian._finish).
    undecided = (first >= table.size) | (
        table.thresholds[first.clamp(max=table.size)] < head + (1 + 2 * TABLE_ERROR)
    )
    magnitude = torch.where(undecided, 0, first)
    values[marked] = torch.where(marked_words < 0, -magnitude, magnitude)
    picked = torch.nonzero(undecided).reshape(-1)
    return Draws(
        values,
        marked[picked].cpu().numpy(),
        marked_words[picked].cpu().numpy(),
        first[picked].cpu().numpy(),
    )


def finish(sampler: RoundedGaussian, draws: Draws, random_bytes: RandomBytes) -> torch.Tensor:
    """The draws with the undecided ones decided, in index order, each reading its further
    words of V from ``random_bytes`` (as ``RoundedGaussian.draw`` does on the CPU)."""
    values = draws.values
    for index, word, first in zip(
        draws.undecided.tolist(), draws.words.tolist(), draws.first.tolist(), strict=True
    ):
        magnitude = sampler.exact_magnitude(word & _HEAD_MASK, first, random_bytes)
        values[index] = -magnitude if word < 0 else magnitude
    return values


def lattice_noise(
    rows: torch.Tensor, lattice: float, sampler: RoundedGaussian, source: SecureRandom
) -> torch.Tensor:
    """``SecureNoise``'s rows on their own device: x ↦ g·(rint(x/g) + K) in float64 (``rows``:
    flat float64), K the table draws of the stream's words, the same values as the CPU's.

    The CPU reads its words a block (``BLOCK`` draws) at a time, each block's undecided draws
    reading their further words before the next block's words. Here up to ``SPAN_BLOCKS``
    blocks' words are computed at once; when a block holds an undecided draw, the words past it are
    given back to the stream (``SecureRandom.rewind``: never used, so never seen), its undecided
    draws read their further words, and the next blocks' words are computed from there."""
    total = rows.numel()
    out = torch.empty_like(rows)
    at = 0
    while at < total:
        start = source.position
        # At most SPAN_BLOCKS blocks' words at once: bounded memory (the keystream's int64
        # words take twice their bytes while computed) whatever the size of the call.
        end = min(total - at, SPAN_BLOCKS * BLOCK)
        words = source.device_words(end, rows.device)
        draws = table_draws(sampler, words)
        if draws.undecided.size:
            end = min(end, (int(draws.undecided[0]) // BLOCK + 1) * BLOCK)
            source.rewind(start + 8 * end)
            keep = draws.undecided < end
            draws = Draws(
                draws.values[:end], draws.undecided[keep], draws.words[keep], draws.first[keep]
            )
        noise = finish(sampler, draws, source.bytes)
        # Division by a power of two is exact, round-half-even as numpy's rint, and the sum
        # and product exact below 2⁵³ (checked, as on the CPU).
        x = torch.round(rows[at : at + end] / lattice) + noise
        if not bool((x.abs() < 2.0**53).all()):
            raise OverflowError("values too large for the lattice")
        out[at : at + end] = x * lattice
        at += end
    return out
