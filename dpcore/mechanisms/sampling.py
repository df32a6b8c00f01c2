"""Samplers whose distribution is exactly what the accountants assume."""

from __future__ import annotations

import math

import numpy as np
import torch

from dpcore.mechanisms.secure_random import SecureRandom

# Gathered rows per chunk (chunk × ℓ × d floats): bounds memory at a few hundred MB.
GATHER_BUDGET = 1 << 25
# Rejection is used while a whole row of ℓ draws is accepted with probability ≥ 1/16 and
# its expected draws (ℓ/p) cost at most a quarter of the n sort keys of the other path.
_MIN_ACCEPT = 1 / 16
_KEY_COST_RATIO = 4


def acceptance(n: int, size: int) -> float:
    """P(``size`` draws with replacement from range(n) are distinct) = Π_{i<ℓ} (1 − i/n)."""
    return math.exp(sum(math.log1p(-i / n) for i in range(size))) if size <= n else 0.0


def uses_rejection(n: int, size: int) -> bool:
    p = acceptance(n, size)
    return p >= _MIN_ACCEPT and size / p * _KEY_COST_RATIO <= n


def chunk_size(*, mixture_degree: int, dim: int, n: int) -> int:
    """Rows per chunk of a mechanism that averages ``mixture_degree`` of ``n`` records of
    ``dim`` entries: bounded gathers, and bounded sort keys for large subsets."""
    by_gather = GATHER_BUDGET // max(1, mixture_degree * dim)
    by_keys = GATHER_BUDGET // max(1, n) if not uses_rejection(n, mixture_degree) else 1 << 16
    return max(1, min(4096, by_gather, by_keys))


def uniform_subsets(
    n: int, size: int, count: int, *, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    """``count`` independent subsets of ``size`` distinct indices from range(n), each exactly
    uniform, as an int64 (count, size) tensor on ``device``.

    Rejection (``uses_rejection``): draw ``size`` indices with replacement (exact uniform
    integers) and redraw rows with a repeat; every ordered tuple of distinct indices is then
    equally likely, so the set is uniform.

    Keys: give each of the n indices an i.i.d. uniform 32-bit key and take the ``size``
    smallest; rows where the ``size``-th and (``size`` + 1)-th smallest keys tie are redrawn.
    Exact: the key vector is exchangeable, and both the selected set (relabelled) and the
    event "tie at the boundary" commute with permutations of range(n), so conditioned on no
    tie, P(set = A) = P(set = π(A)) for every permutation π — the uniform law. Ties inside
    the set or beyond it do not change the set, so they need no redraw.
    """
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    if uses_rejection(n, size):
        return _by_rejection(n, size, count, generator, device)
    return _by_keys(n, size, count, generator, device)


def _by_rejection(
    n: int, size: int, count: int, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    # On the CPU in numpy, where the bytes are: small sorts there are far cheaper than torch's.
    out = generator.integers(n, (count, size))
    bad = np.arange(count)
    while bad.size:
        ordered = np.sort(out[bad], axis=1)
        bad = bad[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        if bad.size:
            out[bad] = generator.integers(n, (bad.size, size))
    return torch.from_numpy(out).to(device)


def _by_keys(
    n: int, size: int, count: int, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    if size == n:  # the whole range: no boundary to tie at
        return generator.keys((count, n), device=device).argsort(dim=1)
    out = torch.empty((count, size), dtype=torch.int64, device=device)
    todo = torch.arange(count, device=device)
    while todo.numel():
        keys = generator.keys((todo.numel(), n), device=device)
        values, indices = keys.topk(size + 1, dim=1, largest=False, sorted=True)
        tie = values[:, size - 1] == values[:, size]
        out[todo[~tie]] = indices[~tie, :size]
        todo = todo[tie]
    return out


def floyd_subsets(
    n: int, size: int, count: int, *, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    """``floyd_indices`` as an int64 tensor on ``device``."""
    return torch.from_numpy(floyd_indices(n, size, count, generator=generator)).to(device)


def floyd_indices(n: int, size: int, count: int, *, generator: SecureRandom) -> np.ndarray:
    """``count`` independent uniform subsets of ``size`` distinct indices from range(n), by
    Floyd's algorithm (Bentley & Floyd, CACM 1987): for j = n − size, …, n − 1 draw t uniform
    in [0, j] and add t, or j when t is already in. Exactly ``size`` exact-uniform draws per
    subset and O(count·size²) work, neither depending on n: where n is private (a class size)
    the work does not reveal it (``uniform_subsets`` redraws rows with a repeat and picks its
    path by n). The only n-dependence left is ``integers``' redraw of words above the largest
    multiple of j + 1 (probability < (j + 1)/2³² per draw). In numpy, as an int64
    (count, size) array: no torch operation sees n."""
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    out = np.empty((count, size), dtype=np.int64)
    for i, j in enumerate(range(n - size, n)):
        t = generator.integers(j + 1, count)
        taken = (out[:, :i] == t[:, None]).any(axis=1)
        out[:, i] = np.where(taken, j, t)
    return out
