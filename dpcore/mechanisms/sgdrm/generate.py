"""SGDRM mixtures (Lee et al., ICLR 2018 workshop).

Mixture t is Σ_i c_{t,i}(x_i, y_i) + noise with c_{t,i} = b_{t,i}·clip(g_{t,i}, −c, c),
b ~ Bern(ℓ/n) and g ~ N(0, 1/ℓ), all independent: exactly the Poisson inclusion and the
coefficient bound the `sgdrm/tight` accountant assumes.

Inclusion is drawn in O(ℓ) per mixture, not as n coins (``sampling.poisson_subsets``): a size
K ~ Binomial(n, ℓ/n), exact (``binomial``: inversion of a uniform V read as bits against
rigorous integer bounds on the CDF, answered only when certain), then a uniform K-subset
(``sampling.uniform_subsets``, exact). P(S = A) = P(K = |A|)/C(n, |A|) = q^|A|(1 − q)^(n−|A|)
for every set A: the law of n independent Bernoulli(q) bits b_{t,·}. g is drawn only where
b = 1, in row-major order, members increasing (elsewhere it would be multiplied by 0, so the
coefficients' law is the same). With ``clip=False`` (the paper's coefficients) g is not
clipped; c then only tells the noise sampler the contribution radius the coupling analysis
starts from (its analysis bound is never smaller).

A mixture is the sparse product Σ_{i: b=1} c_{t,i}(x_i, y_i) in float64, a chunk's sparse
count × n coefficients times the records (``_Mixer``; no dense count × n matrix); the
sampler's error covers n terms of coefficient ≤ c in any order of summation (docs/privacy.md,
"Rounding of the noised rows").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from scipy import sparse

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.sampling import chunk_size, poisson_subsets
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sgdrm.accounting import RECORD_NORM

# Columns of the records per product on the CPU: a chunk's count × 64 float64 block of sums
# (2 MiB at 4096 rows) stays in cache while the entries are added into it.
_TILE = 64


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    mixture_width: int,
    n_samples: int,
    coefficient_bound: float,
    sigma: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    clip: bool = True,
    basis: Basis | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """With a ``basis`` the features are projected (a contraction: a record's contribution
    keeps its radius, plus the projection's rounding) and the noisy rows mapped back."""
    sampler = noise if noise is not None else FastNoise(generator)
    # One Gaussian on the joint (x, y) row: one record's contribution has norm ≤ c·√2.
    radius = coefficient_bound * RECORD_NORM
    n = features.shape[0]
    if labels.shape[0] != n:
        raise ValueError("features and labels disagree on the number of records")
    if not 1 <= mixture_width <= n:
        raise ValueError(f"mixture_width must be between 1 and n={n}")
    scale = 1.0 / math.sqrt(mixture_width)
    device, dtype = features.device, features.dtype
    error = float_error.scaled_sum(radius, terms=n, magnitude=n * radius)
    if basis is not None:
        # Per record: its projected features (norm ≤ 1 as stored) times a coefficient ≤ c.
        error += basis.excess(radius, coefficient_bound * (1.0 + float_error.INPUT_RELATIVE))
        features = basis.project(features)
    width = features.shape[1]
    step = chunk_size(mixture_degree=mixture_width, dim=width + labels.shape[1], n=n)
    with _Mixer(features, labels) as mix:
        for start in range(0, n_samples, step):
            count = min(step, n_samples - start)
            members, pointers = poisson_subsets(n, mixture_width, count, generator=generator)
            g = generator.normal((members.size,), device=device) * scale
            if clip:
                g = g.clamp(-coefficient_bound, coefficient_bound)
            noisy = sampler(mix(pointers, members, g), sigma=sigma, sensitivity=radius, error=error)
            x, y = noisy[:, :width], noisy[:, width:]
            yield (basis.lift(x, dtype) if basis is not None else x.to(dtype)), y.to(dtype)


class _Mixer:
    """C @ [X, Y] in float64 for a chunk's coefficients C, count × n with ≈ ℓ entries a row
    given in compressed rows (members increasing), without a dense count × n matrix.

    On the CPU, C (scipy) times the records cut into tiles of ``_TILE`` columns, each tile a
    contiguous float64 copy made once. With at least n entries, C in compressed columns: a
    product walks the records in order, each once per chunk, and adds each entry's record row
    into its mixture's, whose count × ``_TILE`` block stays in cache — the chunk reads the n
    records once instead of gathering count·ℓ ≥ n rows at random; with fewer entries, C in
    compressed rows gathers them. The tiles are shared out over one Python thread per torch
    thread (scipy's loops release the GIL). On CUDA, torch's compressed-row product. Both
    measured several times faster than a float64 ``embedding_bag``, which runs on one CPU
    thread (docs/results/implementation.md). Each sum comes in record order rather than
    member order; the rounding cover holds for any order."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.n = features.shape[0]
        self.cpu = features.device.type == "cpu"
        self.width = features.shape[1] + labels.shape[1]
        if not self.cpu:
            self.records = torch.cat((features.double(), labels.double()), dim=1)
            self.pool = None
            return
        self.tiles = []
        for start in range(0, self.width, _TILE):
            end = min(start + _TILE, self.width)
            tile = torch.empty((self.n, end - start), dtype=torch.float64)
            for source, offset in ((features, 0), (labels, features.shape[1])):
                lo, hi = max(start, offset), min(end, offset + source.shape[1])
                if lo < hi:
                    tile[:, lo - start : hi - start] = source[:, lo - offset : hi - offset]
            self.tiles.append((start, tile.numpy()))
        threads = min(torch.get_num_threads(), len(self.tiles))
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def __enter__(self) -> _Mixer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def __call__(
        self, pointers: np.ndarray, members: np.ndarray, coefficients: torch.Tensor
    ) -> torch.Tensor:
        shape = (pointers.size - 1, self.n)
        if not self.cpu:
            return _sparse_rows(pointers, members, coefficients, shape) @ self.records
        matrix = sparse.csr_matrix((coefficients.numpy(), members, pointers), shape=shape)
        if members.size >= self.n:  # else gathering the rows reads less than all n of them
            matrix = matrix.tocsc()
        out = np.empty((shape[0], self.width))

        def one(tile: tuple[int, np.ndarray]) -> None:
            start, records = tile
            out[:, start : start + records.shape[1]] = matrix @ records

        if self.pool is None:
            for tile in self.tiles:
                one(tile)
        else:
            list(self.pool.map(one, self.tiles))
        return torch.from_numpy(out)


def _sparse_rows(
    pointers: np.ndarray, members: np.ndarray, coefficients: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """torch's compressed sparse rows on the coefficients' device (members increasing, as the
    format requires: checked)."""
    device = coefficients.device
    with warnings.catch_warnings():
        # torch marks its compressed sparse rows as a beta API; only the product is used.
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(pointers).to(device),
            torch.from_numpy(members).to(device),
            coefficients,
            size=shape,
            check_invariants=True,
        )
