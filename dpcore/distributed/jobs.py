"""What a mechanism hands the distributed engine: a job description built from its params, the
dataset's public declarations and the release's declared noise (``Execution.distributed``,
the one place that decides, per mechanism, whether and how it runs distributed).

A builder does what the mechanism's single-machine ``release`` does before its generator —
the public ``RowTransform``, the σ's read from the declared noise — and refuses, with
``Unsupported``, every option the engine does not implement (never a silent fallback to
different numerics). The engine (``worker/dask_release.run_job``) dispatches on the job's
type, not on a mechanism's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcore.preprocessing import RowTransform


class Unsupported(ValueError):
    """The request uses an option the distributed engine does not implement."""


@dataclass(frozen=True)
class Declared:
    """The dataset's public declarations a job is built from."""

    lo: np.ndarray
    hi: np.ndarray
    feature_shape: tuple[int, ...]
    n_classes: int


@dataclass(frozen=True)
class RecordJob:
    """DPMix's record assignment (``dpcore.distributed.record``)."""

    transform: RowTransform
    mixture_degree: int
    n_samples: int
    sigma_x: float
    sigma_y: float


@dataclass(frozen=True)
class ClassJob:
    """DP-CDA's per-class mixing (``dpcore.distributed.classes``)."""

    transform: RowTransform
    mixture_degree: int
    n_samples: int
    sigma: float
    clip_norm: float
    nonnegative: bool
    min_class_size: int


def refuse_unless(condition: bool, what: str) -> None:
    if not condition:
        raise Unsupported(f"the distributed engine does not implement {what}")
