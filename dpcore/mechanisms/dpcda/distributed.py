"""DP-CDA's distributed job (``Execution.distributed``): the ``declared`` and
``unit_range`` standardisations of ``release.py``, declared class sizes (min_class_size
checked against the private counts by the engine), no basis, no post-processing."""

from __future__ import annotations

import numpy as np

from dpcore.accounting.events import NoiseDescription
from dpcore.distributed.jobs import ClassJob, Declared, refuse_unless
from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.dpcda.accounting_mixing import nonnegative_features
from dpcore.mechanisms.dpcda.params import DPCDAParams
from dpcore.mechanisms.dpcda.release import BASIS_DIM
from dpcore.preprocessing import RowTransform


def job(params: DPCDAParams, declared: Declared, noise: NoiseDescription) -> ClassJob:
    mode = params.standardization
    refuse_unless(mode != "dp", "DP standardisation statistics")
    refuse_unless(params.class_sizes == "declared", "DP class sizes")
    n_features = len(declared.lo)
    basis = basis_for(params, tuple(declared.feature_shape), n_features, BASIS_DIM)
    refuse_unless(basis.identity, "a public basis")
    refuse_unless(params.postprocess == "none", "post-processing")
    lo = np.asarray(declared.lo, dtype=np.float64)
    hi = np.asarray(declared.hi, dtype=np.float64)
    if mode == "declared":
        assert params.feature_mean is not None and params.feature_std is not None
        std = np.asarray(params.feature_std, dtype=np.float64)
        if np.any(std <= 0):
            raise ValueError("declared standard deviations must be > 0")
        mean = np.asarray(params.feature_mean, dtype=np.float64)
        transform = RowTransform(lo, hi, mean, std, params.clip_norm)
    else:
        transform = RowTransform.unit_range(lo, hi, params.clip_norm, divide=False)
    return ClassJob(
        transform=transform,
        mixture_degree=params.mixture_degree,
        n_samples=params.n_samples,
        sigma=noise.sigma("features"),
        clip_norm=params.clip_norm,
        nonnegative=nonnegative_features(mode),
        min_class_size=params.min_class_size,
    )
