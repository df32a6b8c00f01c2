"""Samplers whose distribution is exactly what the accountants assume."""

from __future__ import annotations

import torch

# Gathered rows per chunk (chunk × ℓ × d floats): bounds memory at a few hundred MB.
GATHER_BUDGET = 1 << 25


def chunk_size(*, mixture_degree: int, dim: int, n: int) -> int:
    """Rows per chunk of a mechanism that averages ``mixture_degree`` of ``n`` records of
    ``dim`` entries: bounded gathers, and bounded sort keys for large subsets."""
    by_gather = GATHER_BUDGET // max(1, mixture_degree * dim)
    by_keys = GATHER_BUDGET // max(1, n) if mixture_degree * mixture_degree > n else 1 << 16
    return max(1, min(4096, by_gather, by_keys))


def uniform_subsets(
    n: int, size: int, count: int, *, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """``count`` independent subsets of ``size`` distinct indices from range(n), each uniform.

    Small subsets (birthday regime) use rejection: draw ``size`` indices with replacement and
    redraw rows with a repeat; every ordered tuple of distinct indices is then equally likely,
    so the set is uniform. Large subsets take the ``size`` smallest of n i.i.d. float64
    uniform keys, uniform up to ties (probability below n²·2⁻⁵⁴ per subset).
    """
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    if size * size <= n:
        out = torch.randint(0, n, (count, size), generator=generator, device=device)
        while True:
            ordered, _ = out.sort(dim=1)
            bad = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1).nonzero().flatten()
            if bad.numel() == 0:
                return out
            out[bad] = torch.randint(0, n, (bad.numel(), size), generator=generator, device=device)
    keys = torch.rand((count, n), generator=generator, device=device, dtype=torch.float64)
    return keys.topk(size, dim=1, largest=False).indices


def floyd_subsets(
    n: int, size: int, count: int, *, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """``count`` independent uniform subsets of ``size`` distinct indices from range(n), by
    Floyd's algorithm (Bentley & Floyd, CACM 1987): for j = n − size, …, n − 1 draw t uniform
    in [0, j] and add t, or j when t is already in. Exactly ``size`` draws per subset and
    O(count·size²) work, neither depending on n: where n is private (a class size) the run
    time and the randomness consumed do not reveal it (``uniform_subsets`` redraws and sorts
    by n)."""
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    out = torch.empty((count, size), dtype=torch.int64, device=device)
    for i, j in enumerate(range(n - size, n)):
        t = torch.randint(0, j + 1, (count,), generator=generator, device=device)
        taken = (out[:, :i] == t[:, None]).any(dim=1)
        out[:, i] = torch.where(taken, torch.full_like(t, j), t)
    return out
