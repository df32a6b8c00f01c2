"""DPMix's distributed job (``Execution.distributed``): the record assignment only, the
preprocessing of ``release.py`` (unit-scale transform), no basis, no post-processing."""

from __future__ import annotations

from dpcore.accounting.events import NoiseDescription
from dpcore.distributed.jobs import Declared, RecordJob, refuse_unless
from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.dpmix.params import DPMixParams
from dpcore.mechanisms.dpmix.release import BASIS_DIM
from dpcore.preprocessing import RowTransform


def job(params: DPMixParams, declared: Declared, noise: NoiseDescription) -> RecordJob:
    refuse_unless(params.assignment == "record", "DPMix's mixture assignment")
    n_features = len(declared.lo)
    basis = basis_for(params, tuple(declared.feature_shape), n_features, BASIS_DIM)
    refuse_unless(basis.identity, "a public basis")
    refuse_unless(params.postprocess == "none", "post-processing")
    return RecordJob(
        # unit_transform(data, clip_norm), from the declared bounds alone
        transform=RowTransform.unit_range(declared.lo, declared.hi, params.clip_norm),
        mixture_degree=params.mixture_degree,
        n_samples=params.n_samples,
        sigma_x=noise.sigma("features"),
        sigma_y=noise.sigma("labels"),
    )
