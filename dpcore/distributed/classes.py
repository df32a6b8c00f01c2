"""DP-CDA's per-class mixing as a map–reduce job with routed rank requests.

Single-machine reference: ``dpcore.mechanisms.dpcda.generate.generate``, with which it shares
``dpcore.mechanisms.class_mixing`` (chunks, class order, sensitivity). Per class c,
T_c = ⌈T/K⌉ mixtures, each the mean of ℓ records of class c drawn uniformly without
replacement (Floyd's sampler on the class's ranks 0 … N_c − 1, in the order of a stable sort
of the labels), independently per mixture, plus N(0, σ²I); the label is c, exact.

The job, over partitions p = 0 … P − 1 (the dataset's order):

1. ``index_partition`` (map, once; kept in the cluster's memory): the partition's
   preprocessed rows, a stable argsort of its labels and its per-class counts.
2. ``class_counts``: the partitions' counts, summed by the driver into N_c and the offsets
   O[p, c] (records of class c in partitions before p). These are PRIVATE: they move only
   inside the trusted cluster (worker → driver, and back inside routed requests), are never
   written to the output, the metadata, logs or progress, and the driver never lets them shape
   anything visible outside (see "What the work reveals").
3. The driver draws, chunk by chunk exactly as the single machine does (same chunk sizes,
   same order, ``floyd_indices(N_c, ℓ, count)``), every mixture's ℓ member ranks in its class.
   ``route`` sends rank r of class c to the partition p with O[p, c] ≤ r < O[p + 1, c], as
   the local rank r − O[p, c]: the (r − O[p, c])-th record of class c in partition p is the
   r-th of class c in the dataset's order, the record the single machine's stable argsort
   puts at rank r. So with the same stream the distributed job picks *the same records*;
   with independent streams, the same law.
4. ``gather`` (map, per chunk and partition holding requested ranks): the partial sum per
   mixture of its members held there (sparse: the mixtures touched, their sums).
5. ``reduce_chunk`` and ``finish``: the sum over partitions, in partition order, times 1/ℓ,
   plus N(0, σ²) from the reducer's own key, labels one-hot c; rows in the single machine's
   order. A mixture's members are summed in dataset order within a partition and its partial
   sums in partition order, so its bits depend on its member set only: a record moving between
   classes (which shifts later ranks) leaves every other mixture's bits unchanged, as the
   secure sampler's cover assumes.

Same law: the ranks are drawn exactly as the single machine draws them (Floyd, ℓ exact
uniform draws per mixture, independent across mixtures); the routing is a bijection between
class ranks and records, the same one; the sums are deterministic given the members, with
rounding covered by ``float_error.scaled_sum(Δ, terms=ℓ, magnitude=C)``, the bound for a
float64 sum of ℓ rows in any order (the gather sums in float64; the single machine sums
float32 rows in float32 blocks and covers that with its own, larger bound,
``sampling.gather_sum_error``); the noise is i.i.d., independent of the members.

What the work reveals. The driver's draws and the reducers' work are those of the single
machine: sized by n, K, T_c, ℓ and d only. The gather tasks are not: how many requests
partition p receives depends on its private class counts. So task durations, task sizes and
the scheduler's dashboard are private to the cluster (like the data); nothing of them may be
exported as metrics or logs outside it. The job's total time is the single machine's
data-independent work plus a gather whose total size T·ℓ is public.

Not supported (refused by the driver): a public ``basis``, ``standardization: dp``,
``class_sizes: dp``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.class_mixing import class_chunks, class_order, mixture_sensitivity
from dpcore.mechanisms.noise import NoiseSampler


@dataclass(frozen=True)
class ClassIndex:
    """A partition ready for gathers: preprocessed rows (float32), the stable argsort of its
    labels, and ``starts`` (K + 1 cumulative counts: PRIVATE)."""

    features: np.ndarray
    order: np.ndarray
    starts: np.ndarray


@dataclass(frozen=True)
class Request:
    """Rank requests for one partition: chunk-local mixture rows and the ranks, within the
    partition's records of the chunk's class, of their members held there."""

    mixture: np.ndarray
    rank: np.ndarray


@dataclass(frozen=True)
class Partial:
    """A gather's partial sums: the chunk-local mixture rows touched and their sums."""

    ids: np.ndarray
    sums: np.ndarray


@dataclass(frozen=True)
class Chunk:
    """One chunk of the output: ``count`` mixtures of class ``c`` (public)."""

    c: int
    count: int


def chunks(
    *, n: int, n_classes: int, mixture_degree: int, n_samples: int, dim: int
) -> Iterator[Chunk]:
    """The single machine's chunks, in its order (public sizes only)."""
    for c, count in class_chunks(
        n=n, n_classes=n_classes, mixture_degree=mixture_degree, n_samples=n_samples, dim=dim
    ):
        yield Chunk(c, count)


def index_partition(
    features: np.ndarray, labels: np.ndarray, *, n_classes: int, nonnegative: bool
) -> ClassIndex:
    """The map of step 1 (the single machine's premise check included)."""
    if labels.ndim != 1 or labels.shape[0] != features.shape[0]:
        raise ValueError("labels must be class indices, one per record")
    if nonnegative and bool((features < 0).any()):
        raise ValueError("non-negative features were promised, a negative one was found")
    order, counts, starts = class_order(labels, n_classes)
    if counts.shape[0] != n_classes:
        raise ValueError("a label is outside the declared classes")
    return ClassIndex(np.ascontiguousarray(features, dtype=np.float32), order, starts)


def class_counts(index: ClassIndex) -> np.ndarray:
    """The partition's per-class counts (PRIVATE)."""
    return np.diff(index.starts)


def offsets(counts: Sequence[np.ndarray]) -> np.ndarray:
    """O ((P + 1) × K): records of each class in the partitions before p (PRIVATE)."""
    stacked = np.stack([np.asarray(c, dtype=np.int64) for c in counts])
    return np.concatenate([np.zeros((1, stacked.shape[1]), np.int64), np.cumsum(stacked, 0)])


def route(ranks: np.ndarray, c: int, where: np.ndarray) -> dict[int, Request]:
    """Rank requests per partition for a chunk of class ``c`` whose ``ranks`` (count × ℓ) are
    class ranks; ``where`` is ``offsets``. Partitions holding no requested rank get none."""
    flat = ranks.reshape(-1)
    mixture = np.repeat(np.arange(ranks.shape[0], dtype=np.int64), ranks.shape[1])
    column = where[:, c]
    if flat.size and int(flat.max()) >= int(column[-1]):
        raise ValueError("a rank beyond the class's records")
    part = np.searchsorted(column, flat, side="right") - 1
    # By partition, then mixture, then rank: ``gather`` adds a mixture's members in the order
    # listed, so each partial sum runs in dataset order, a function of the member set alone
    # (not of the order the draws came in), as the single machine's sums are.
    order = np.lexsort((flat, mixture, part))
    part, flat, mixture = part[order], flat[order], mixture[order]
    out: dict[int, Request] = {}
    cuts = np.flatnonzero(np.diff(part)) + 1
    for a, z in zip(np.r_[0, cuts], np.r_[cuts, part.size], strict=True):
        if z > a:
            p = int(part[a])
            out[p] = Request(mixture[a:z], flat[a:z] - column[p])
    return out


def gather(index: ClassIndex, c: int, request: Request) -> Partial:
    """The map of step 4: the partition's members of each requested mixture, summed in the
    order the request lists them (``route``: rank order, which is dataset order; the CPU's
    ``index_add_`` adds a group's rows in row order)."""
    if request.rank.size and (
        int(request.rank.min()) < 0
        or int(request.rank.max()) >= int(index.starts[c + 1] - index.starts[c])
    ):
        raise ValueError("a rank beyond the partition's records of the class")
    rows = index.order[index.starts[c] + request.rank]
    values = torch.from_numpy(index.features[rows]).double()
    unique, inverse = torch.unique(torch.from_numpy(request.mixture), return_inverse=True)
    sums = torch.zeros((unique.numel(), values.shape[1]), dtype=torch.float64)
    sums.index_add_(0, inverse, values)
    return Partial(unique.numpy(), sums.numpy())


def reduce_chunk(parts: Sequence[Partial], count: int, dim: int) -> torch.Tensor:
    """The exact (float64) member sums of the chunk's ``count`` mixtures."""
    acc = torch.zeros((count, dim), dtype=torch.float64)
    for part in parts:
        acc.index_add_(0, torch.from_numpy(part.ids), torch.from_numpy(part.sums))
    return acc


def noise_bounds(
    *, clip_norm: float, mixture_degree: int, nonnegative: bool
) -> tuple[float, float]:
    """(Δ, e): the accountant's sensitivity and the rounding bound of the reducers' float64
    sums of ℓ rows (the single machine's for float64 rows)."""
    sensitivity = mixture_sensitivity(
        clip_norm=clip_norm, mixture_degree=mixture_degree, nonnegative=nonnegative
    )
    return sensitivity, float_error.scaled_sum(
        sensitivity, terms=mixture_degree, magnitude=clip_norm
    )


def finish(
    sums: torch.Tensor,
    chunk: Chunk,
    *,
    n_classes: int,
    mixture_degree: int,
    sigma: float,
    clip_norm: float,
    nonnegative: bool,
    sampler: NoiseSampler,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Means plus N(0, σ²) (float32), one-hot labels of the chunk's class."""
    sensitivity, error = noise_bounds(
        clip_norm=clip_norm, mixture_degree=mixture_degree, nonnegative=nonnegative
    )
    noisy = sampler(sums / mixture_degree, sigma=sigma, sensitivity=sensitivity, error=error)
    onehot = torch.zeros((chunk.count, n_classes), dtype=torch.float32)
    onehot[:, chunk.c] = 1
    return noisy.to(torch.float32), onehot
