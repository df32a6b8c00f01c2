"""A DPMix release job: unit-scale preprocessing, then the mixtures of the chosen assignment."""

from __future__ import annotations

from dpcore.mechanisms.dpmix.generate import generate, generate_by_record
from dpcore.mechanisms.dpmix.params import DPMixParams
from dpcore.mechanisms.inputs import unit_scale
from dpcore.mechanisms.spec import PrivateData, ReleaseOutput, RunContext


def release(params: DPMixParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    features, labels = unit_scale(data, ctx.device)
    mix = generate_by_record if params.assignment == "record" else generate
    return ReleaseOutput(
        rows=params.n_samples,
        feature_names=list(data.feature_names),
        chunks=mix(
            features,
            labels,
            mixture_degree=params.mixture_degree,
            n_samples=params.n_samples,
            sigma_x=ctx.sigma("features"),
            sigma_y=ctx.sigma("labels"),
            generator=ctx.generator,
            noise=ctx.sampler,
        ),
    )
