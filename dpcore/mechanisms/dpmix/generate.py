"""DPMix (Lee et al., ISIT 2019): noisy means of ℓ records drawn uniformly without replacement.

Inputs are preprocessed (features in [0, 1] with L2 norm ≤ 1, one-hot labels), which is what
the accountant's sensitivity assumes. Two assignments:

- ``mixture`` (the paper's main mechanism): every mixture draws its own uniform ℓ-subset,
  independently; mixtures are generated in chunks so memory stays bounded;
- ``record`` (the paper's Appendix B variant, Theorem 3): every record joins exactly
  k = ⌈Tℓ/n⌉ distinct mixtures chosen uniformly among the T, independently per record; each
  mixture is (1/ℓ)·(sum of its members), so mixture sizes vary around ℓ. The assignment never
  looks at the data, which is what the record accountant's sensitivity argument needs.

Means are sums of gathered rows (``sampling.gather_sum``: float32 rows summed in float32
blocks of 64, the blocks in float64; float64 rows in float64) scaled by 1/ℓ in float64; the
noise sampler's ``error`` covers that rounding (``sampling.gather_sum_error``) and, with a
basis, the projection's and its float32 storage's (``Basis.excess``, ``Basis.stored_excess``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from dpcore.mechanisms import float_error, sampling, segments
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.record_assignment import (
    FEATURE_SENSITIVITY,
    LABEL_SENSITIVITY,
    mixtures_per_record,
)
from dpcore.mechanisms.sampling import chunk_size, gather_sum, gather_sum_error, uniform_subsets
from dpcore.mechanisms.secure_random import SecureRandom


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    mixture_degree: int,
    n_samples: int,
    sigma_x: float,
    sigma_y: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    basis: Basis | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield chunks ``(X', Y')`` of noisy mixtures until ``n_samples`` rows were produced.

    ``features`` (n × d) and ``labels`` (n × k) must be preprocessed and on one device.
    ``generator`` draws the subsets; ``noise`` the noise (default: the fast sampler on
    ``generator``; release jobs pass the sampler the request chose).
    """
    dtype = features.dtype
    if basis is not None:
        features = basis.project_stored(features)
    add = _noiser(
        noise,
        generator,
        mixture_degree,
        sigma_x,
        sigma_y,
        terms=mixture_degree,
        dtype=dtype,
        sum_dtypes=(features.dtype, labels.dtype),
        basis=basis,
    )
    n, dim = features.shape
    if labels.shape[0] != n:
        raise ValueError("features and labels disagree on the number of records")
    device = features.device
    step = chunk_size(mixture_degree=mixture_degree, dim=dim + labels.shape[1], n=n)
    produced = 0
    while produced < n_samples:
        count = min(step, n_samples - produced)
        idx = uniform_subsets(n, mixture_degree, count, generator=generator, device=device)
        yield add(
            gather_sum(features, idx) / mixture_degree, gather_sum(labels, idx) / mixture_degree
        )
        produced += count


def _noiser(
    noise: NoiseSampler | None,
    generator: SecureRandom,
    mixture_degree: int,
    sigma_x: float,
    sigma_y: float,
    *,
    terms: int,
    dtype: torch.dtype,
    sum_dtypes: tuple[torch.dtype, torch.dtype] = (torch.float64, torch.float64),
    basis: Basis | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Noise for one mixture's mean: one record moves it by at most (its norm bound)/ℓ.

    Rows arrive as sums of at most ``terms`` unit-norm records over ℓ, accumulated as
    ``gather_sum`` does for tables of ``sum_dtypes`` (features, labels; float64 sums for the
    record assignment); the sampler covers their rounding (``gather_sum_error``) and the
    result goes back to ``dtype``. With a
    ``basis`` the features arrive projected (a contraction: the same sensitivity, plus the
    projection's rounding) and noisy rows are mapped back."""
    sampler = noise if noise is not None else FastNoise(generator)
    dx, dy = FEATURE_SENSITIVITY / mixture_degree, LABEL_SENSITIVITY / mixture_degree
    magnitude = terms / mixture_degree
    # ``Basis.project_stored``'s rows (projected, summed in float32) are slightly longer.
    stored = basis is not None and sum_dtypes[0] == torch.float32
    summed = basis.stored_norm(magnitude) if basis is not None and stored else magnitude
    ex = gather_sum_error(dx, terms=terms, magnitude=summed, dtype=sum_dtypes[0])
    ey = gather_sum_error(dy, terms=terms, magnitude=magnitude, dtype=sum_dtypes[1])
    if basis is not None:
        # Per record (norm ≤ 1 as stored): conservative, the mixture divides it by ℓ.
        ex += basis.excess(dx, 1.0 + float_error.INPUT_RELATIVE)
        if stored:
            ex += basis.stored_excess(1.0 + float_error.INPUT_RELATIVE)

    def add(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noisy = sampler(x, sigma=sigma_x, sensitivity=dx, error=ex)
        return (
            basis.lift(noisy, dtype) if basis is not None else noisy.to(dtype),
            sampler(y, sigma=sigma_y, sensitivity=dy, error=ey).to(dtype),
        )

    return add


def generate_by_record(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    mixture_degree: int,
    n_samples: int,
    sigma_x: float,
    sigma_y: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    basis: Basis | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield chunks ``(X', Y')`` of the record-assignment variant (T rows in all)."""
    # A mixture sums at most n records (sizes vary): the rounding bound takes all n.
    add = _noiser(
        noise,
        generator,
        mixture_degree,
        sigma_x,
        sigma_y,
        terms=features.shape[0],
        dtype=features.dtype,
        basis=basis,
    )
    if basis is not None:
        features = basis.project(features)
    n, dim = features.shape
    if labels.shape[0] != n:
        raise ValueError("features and labels disagree on the number of records")
    k = mixtures_per_record(n=n, mixture_degree=mixture_degree, n_samples=n_samples)
    if k > n_samples:
        raise ValueError(f"each record would join {k} of only {n_samples} mixtures")
    device = features.device
    sums_x = torch.zeros((n_samples, dim), dtype=torch.float64, device=device)
    sums_y = torch.zeros((n_samples, labels.shape[1]), dtype=torch.float64, device=device)
    # Records in chunks (their float64 copy and their k targets bounded); each record row is
    # added to its k mixtures by k segment sums, never repeated k times in memory.
    step = max(1, min(n, sampling.GATHER_BUDGET // max(1, k + dim + labels.shape[1])))
    for start in range(0, n, step):
        stop = min(n, start + step)
        # Row r of `joined` lists the k distinct mixtures record start + r joins.
        joined = uniform_subsets(n_samples, k, stop - start, generator=generator, device=device)
        rows_x, rows_y = features[start:stop].double(), labels[start:stop].double()
        for j in range(k):
            segments.segment_sum(sums_x, joined[:, j], rows_x)
            segments.segment_sum(sums_y, joined[:, j], rows_y)
    chunk = chunk_size(mixture_degree=1, dim=dim + labels.shape[1], n=n)
    for start in range(0, n_samples, chunk):
        yield add(
            sums_x[start : start + chunk] / mixture_degree,
            sums_y[start : start + chunk] / mixture_degree,
        )
