"""Class-centric mixing's shared pieces: DP-CDA's single-machine generator and accountant,
and the distributed engine's per-class job (``dpcore.distributed.classes``), which must draw
the same mixtures from the same records.

- the output's shape: T_c = ⌈T/K⌉ mixtures per class, in chunks sized by public sizes only;
- the routing of class ranks to records: the stable sort of the labels, so that rank r of
  class c is the r-th record of class c in the dataset's order;
- the sensitivity of one mixture mean when one of its ℓ members is replaced (the
  accountant's, derived in ``dpcore.mechanisms.dpcda.accounting_mixing``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from dpcore.mechanisms.sampling import chunk_size


def record_distance(*, clip_norm: float, nonnegative: bool) -> float:
    """The largest ‖x − x′‖ of two preprocessed records: √2·C when every feature is ≥ 0
    (⟨x, x′⟩ ≥ 0), 2C otherwise."""
    return (math.sqrt(2.0) if nonnegative else 2.0) * clip_norm


def mixture_sensitivity(*, clip_norm: float, mixture_degree: int, nonnegative: bool) -> float:
    """L2 sensitivity of one mixture mean when one member is replaced: √2·C/ℓ for
    non-negative features, 2C/ℓ otherwise."""
    return record_distance(clip_norm=clip_norm, nonnegative=nonnegative) / mixture_degree


def per_class(n_samples: int, n_classes: int) -> int:
    """T_c = ⌈T/K⌉: the mixtures released for each class."""
    return -(-n_samples // n_classes)


def class_chunks(
    *, n: int, n_classes: int, mixture_degree: int, n_samples: int, dim: int
) -> Iterator[tuple[int, int]]:
    """(class, mixtures) of each chunk of the output, in the output's order, class by class
    (public sizes only: n, K, T_c, ℓ and d)."""
    rows = per_class(n_samples, n_classes)
    step = chunk_size(mixture_degree=mixture_degree, dim=dim, n=n)
    for c in range(n_classes):
        for start in range(0, rows, step):
            yield c, min(step, rows - start)


def class_order(labels: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, counts, starts) of class indices ``labels``: the stable argsort, the per-class
    counts (PRIVATE) and their K + 1 cumulative sums. Rank r of class c is the record
    ``order[starts[c] + r]``."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=n_classes)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return order, counts, starts
