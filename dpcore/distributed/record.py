"""DPMix's record assignment as a map–reduce job.

Single-machine reference: ``dpcore.mechanisms.dpmix.generate.generate_by_record``, with which
it shares ``dpcore.mechanisms.record_assignment`` (k and the sensitivities). Record i
joins k = ⌈Tℓ/n⌉ distinct mixtures chosen uniformly among the T, independently per record;
mixture t is (1/ℓ)·(sum of its members' [features | one-hot labels]) plus Gaussian noise with
the ``_noiser`` sensitivities FEATURE_SENSITIVITY/ℓ and LABEL_SENSITIVITY/ℓ.

The job. The T mixture ids are cut into B contiguous buckets (``RecordPlan.bounds``); each
reducer owns one bucket.

- map(partition p, its own source): for each of the partition's records, k distinct mixture
  ids by ``sampling.uniform_subsets(T, k, rows, ...)`` (exact uniform), and the partial sums
  of the partition's records per mixture, cut by bucket. Two forms, chosen by the cost model
  (docs/scaling.md) from public sizes only: *dense* (the bucket's whole range × width, zeros
  included) when the partition holds enough records that most mixtures get one
  (n_p·k·(D + 1) ≥ T·D), else *sparse* (the sorted ids touched and their summed rows).
- reduce(bucket b, the B-th slice of every map's output, its own source): the sum of the
  partials, times 1/ℓ, plus the declared noise, the rows in mixture-id order.

Same law as the single machine. The record assignment is a family of independent uniform
k-subsets, one per record; which machine draws record i's subset, and from which stream,
does not change its law or its independence from every other record's (each map task draws
from its own key, streams under independent keys are independent). Given the assignment, the
mixture sums are a deterministic function of the records (computed here in another order:
see the rounding below). The noise is i.i.d. Gaussian per entry, independent of the
assignment, drawn by the reducers from their own keys: the same joint law.

Rounding. A mixture's sum is a sum of at most n member rows evaluated along some binary tree
(chains of adds in each map, the reducer's adds across maps; adding the dense partials' exact
zeros is exact): Higham's bound for any summation order covers it, so the reducers pass the
sampler the very ``float_error.scaled_sum(Δ, terms=n, magnitude=n/ℓ)`` the single-machine
path passes (``noise_bounds``).

Not supported (refused by the driver): a public ``basis``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpcore.mechanisms import float_error, sampling
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.record_assignment import (
    FEATURE_SENSITIVITY,
    LABEL_SENSITIVITY,
    mixtures_per_record,
)
from dpcore.mechanisms.secure_random import SecureRandom

# Rows × width of one reducer's float64 accumulator (128 MiB): bounds a reducer's memory.
REDUCE_BUDGET = 1 << 24
_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Partial:
    """One map task's sums for one bucket: ``ids`` None → dense (``sums`` has the bucket's
    every row); else the bucket-local ids (sorted, distinct) of the rows in ``sums``."""

    ids: np.ndarray | None
    sums: np.ndarray  # float64 (rows × width)


@dataclass(frozen=True)
class RecordPlan:
    """The job's public shape: n, ℓ, T, the widths and the buckets' boundaries."""

    n: int
    mixture_degree: int
    n_samples: int
    dim_x: int
    dim_y: int
    bounds: tuple[int, ...]  # B + 1 increasing ids, 0 … T

    @classmethod
    def make(
        cls,
        *,
        n: int,
        mixture_degree: int,
        n_samples: int,
        dim_x: int,
        dim_y: int,
        bucket_rows: int | None = None,
        min_buckets: int = 1,
    ) -> RecordPlan:
        """Buckets of ``bucket_rows`` mixtures; by default as large as the reducer's budget
        allows but at least ``min_buckets`` of them (the driver asks for one per partition,
        so the reduces — the noise — run in parallel too)."""
        if not 1 <= mixture_degree <= n:
            raise ValueError(f"mixture_degree must be in [1, {n}]")
        width = dim_x + dim_y
        rows = bucket_rows or min(
            max(1, REDUCE_BUDGET // max(1, width)), -(-n_samples // max(1, min_buckets))
        )
        rows = max(1, min(rows, n_samples))
        bounds = (*range(0, n_samples, rows), n_samples)
        plan = cls(n, mixture_degree, n_samples, dim_x, dim_y, tuple(bounds))
        if plan.k > n_samples:
            raise ValueError(f"each record would join {plan.k} of only {n_samples} mixtures")
        return plan

    @property
    def k(self) -> int:
        return mixtures_per_record(
            n=self.n, mixture_degree=self.mixture_degree, n_samples=self.n_samples
        )

    @property
    def width(self) -> int:
        return self.dim_x + self.dim_y

    @property
    def buckets(self) -> int:
        return len(self.bounds) - 1

    def dense(self, rows: int) -> bool:
        """Dense partials for a partition of ``rows`` records: a dense bucket costs
        len·D floats, a sparse one about rows·k·len/T·(D + 1) (ids included)."""
        return rows * self.k * (self.width + 1) >= self.n_samples * self.width

    def noise_bounds(self) -> tuple[float, float, float, float]:
        """(Δx, Δy, ex, ey): sensitivities and rounding bounds, as the single machine's."""
        ell = self.mixture_degree
        dx, dy = FEATURE_SENSITIVITY / ell, LABEL_SENSITIVITY / ell
        magnitude = self.n / ell
        return (
            dx,
            dy,
            float_error.scaled_sum(dx, terms=self.n, magnitude=magnitude),
            float_error.scaled_sum(dy, terms=self.n, magnitude=magnitude),
        )


def assign(rows: int, plan: RecordPlan, source: SecureRandom) -> torch.Tensor:
    """The k distinct mixture ids of each of ``rows`` records (int64, rows × k), drawn in
    steps of bounded size; every row an independent exact-uniform k-subset of range(T)."""
    k = plan.k
    step = max(1, sampling.GATHER_BUDGET // max(1, k * plan.width))
    parts = [
        sampling.uniform_subsets(
            plan.n_samples, k, min(step, rows - start), generator=source, device=_CPU
        )
        for start in range(0, rows, step)
    ]
    return torch.cat(parts) if parts else torch.empty((0, k), dtype=torch.int64)


def map_partition(
    features: np.ndarray, labels: np.ndarray, plan: RecordPlan, source: SecureRandom
) -> list[Partial]:
    """The map: ``features`` (n_p × dim_x) and one-hot ``labels`` (n_p × dim_y), preprocessed
    (float32, rows of norm ≤ 1 as the accountant assumes); one ``Partial`` per bucket."""
    if features.shape[0] != labels.shape[0]:
        raise ValueError("features and labels disagree on the number of records")
    if features.shape[1] != plan.dim_x or labels.shape[1] != plan.dim_y:
        raise ValueError("the partition's widths are not the plan's")
    rows = features.shape[0]
    data = torch.from_numpy(np.concatenate([features, labels], axis=1))
    joined = assign(rows, plan, source)
    return partials(data, joined, plan)


def partials(data: torch.Tensor, joined: torch.Tensor, plan: RecordPlan) -> list[Partial]:
    """Per-bucket partial sums of ``data``'s rows (row r added to every mixture of
    ``joined[r]``), dense or sparse by ``plan.dense``."""
    k, width, total = plan.k, plan.width, plan.n_samples
    rows = data.shape[0]
    step = max(1, sampling.GATHER_BUDGET // max(1, width))  # float64 rows converted at once
    if plan.dense(rows):
        acc = torch.zeros((total, width), dtype=torch.float64)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            block = data[start:stop].double()
            # One index_add per column of ids: k times faster than adding k repeated rows.
            for column in range(k):
                acc.index_add_(0, joined[start:stop, column], block)
        return [
            Partial(None, acc[lo:hi].numpy().copy())
            for lo, hi in zip(plan.bounds[:-1], plan.bounds[1:], strict=True)
        ]
    ids = joined.reshape(-1)
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    sums = torch.zeros((unique.numel(), width), dtype=torch.float64)
    inverse = inverse.reshape(rows, k)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = data[start:stop].double()
        for column in range(k):
            sums.index_add_(0, inverse[start:stop, column], block)
    cuts = torch.searchsorted(unique, torch.tensor(plan.bounds, dtype=torch.int64)).tolist()
    out = []
    for b in range(plan.buckets):
        a, z = cuts[b], cuts[b + 1]
        out.append(Partial((unique[a:z] - plan.bounds[b]).numpy(), sums[a:z].numpy()))
    return out


def reduce_bucket(bucket: int, parts: Sequence[Partial], plan: RecordPlan) -> torch.Tensor:
    """The exact (float64) mixture sums of one bucket, rows in mixture-id order."""
    lo, hi = plan.bounds[bucket], plan.bounds[bucket + 1]
    acc = torch.zeros((hi - lo, plan.width), dtype=torch.float64)
    for part in parts:
        sums = torch.from_numpy(part.sums)
        if part.ids is None:
            if sums.shape != acc.shape:
                raise ValueError("a dense partial of the wrong shape")
            acc += sums
        elif part.ids.size:
            acc.index_add_(0, torch.from_numpy(part.ids), sums)
    return acc


def finish(
    sums: torch.Tensor,
    plan: RecordPlan,
    sampler: NoiseSampler,
    *,
    sigma_x: float,
    sigma_y: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Means of the bucket's mixtures plus the declared noise (float32 rows, like the single
    machine's: features, then labels)."""
    dx, dy, ex, ey = plan.noise_bounds()
    means = sums / plan.mixture_degree
    x = sampler(means[:, : plan.dim_x].contiguous(), sigma=sigma_x, sensitivity=dx, error=ex)
    y = sampler(means[:, plan.dim_x :].contiguous(), sigma=sigma_y, sensitivity=dy, error=ey)
    return x.to(torch.float32), y.to(torch.float32)


def bytes_shuffled(plan: RecordPlan, partition_rows: Sequence[int]) -> int:
    """Expected bytes the maps emit (the shuffle), by the same rule the maps follow."""
    total = 0
    for rows in partition_rows:
        if plan.dense(rows):
            total += plan.n_samples * plan.width * 8
        else:
            # distinct ids touched: T·(1 − (1 − k/T)^rows), each a row of D floats and an id
            miss = 0.0 if plan.k == plan.n_samples else math.log1p(-plan.k / plan.n_samples)
            touched = plan.n_samples * -math.expm1(rows * miss) if miss else plan.n_samples
            total += int(touched) * (plan.width * 8 + 8)
    return total
