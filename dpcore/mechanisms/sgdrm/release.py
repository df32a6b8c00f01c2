"""An SGDRM release job: unit-scale preprocessing, then random combinations with the
coefficient bound the accountant fixed (the declared noise's contribution radius)."""

from __future__ import annotations

from dpcore.mechanisms.inputs import unit_scale
from dpcore.mechanisms.sgdrm.accounting import RECORD_NORM
from dpcore.mechanisms.sgdrm.generate import generate
from dpcore.mechanisms.sgdrm.params import SGDRMParams
from dpcore.mechanisms.spec import PrivateData, ReleaseOutput, RunContext


def release(params: SGDRMParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    features, labels = unit_scale(data, ctx.device)
    scale = ctx.noise.scale("mixtures")
    # The clip (clipped) or the lattice's radius (gaussian), exactly as the accountant set it.
    bound = ctx.noise.analysis.get("coefficient_bound", scale.sensitivity / RECORD_NORM)
    return ReleaseOutput(
        rows=params.n_samples,
        feature_names=list(data.feature_names),
        chunks=generate(
            features,
            labels,
            mixture_width=params.mixture_width,
            n_samples=params.n_samples,
            coefficient_bound=bound,
            clip=params.coefficients == "clipped",
            sigma=scale.sigma,
            generator=ctx.generator,
            noise=ctx.sampler,
        ),
    )
