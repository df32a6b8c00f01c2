"""A local-perturbation release job: unit-scale preprocessing, every record noised once."""

from __future__ import annotations

from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.local_perturbation.generate import local_perturbation
from dpcore.mechanisms.local_perturbation.params import LocalPerturbationParams


def release(params: LocalPerturbationParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    transform = unit_transform(data, params.clip_norm)
    features, labels = unit_scale(data, ctx.device, transform)
    return ReleaseOutput(
        rows=data.n_rows,
        feature_names=list(data.feature_names),
        chunks=local_perturbation(
            features,
            labels,
            sigma_x=ctx.sigma("features"),
            sigma_y=ctx.sigma("labels"),
            generator=ctx.generator,
            noise=ctx.sampler,
        ),
        transform=transform,
    )
