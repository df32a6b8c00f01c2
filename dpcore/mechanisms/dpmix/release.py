"""A DPMix release job: unit-scale preprocessing, optionally a public basis, then the mixtures
of the chosen assignment, then the requested free post-processing."""

from __future__ import annotations

from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.contract import UNIT_SCALE, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.dpmix.generate import generate, generate_by_record
from dpcore.mechanisms.dpmix.params import DPMixParams
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.postprocess import postprocessor

# k of the default basis on image-shaped data: the MNIST sweet-spot study (docs/results).
BASIS_DIM = 64


def release(params: DPMixParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    transform = unit_transform(data, params.clip_norm)
    features, labels = unit_scale(data, ctx.device, transform)
    basis = basis_for(params, tuple(data.feature_shape), features.shape[1], BASIS_DIM)
    mix = generate_by_record if params.assignment == "record" else generate
    sigma_x = ctx.sigma("features")
    post = postprocessor(
        params.postprocess,
        sigma=sigma_x,
        basis=basis,
        grouped=False,  # mixed labels: no exact class to group by
        unit_box=True,
        max_norm=1.0,
        noisy_labels=True,
    )
    return ReleaseOutput(
        rows=params.n_samples,
        feature_names=list(data.feature_names),
        chunks=mix(
            features,
            labels,
            mixture_degree=params.mixture_degree,
            n_samples=params.n_samples,
            sigma_x=sigma_x,
            sigma_y=ctx.sigma("labels"),
            generator=ctx.generator,
            noise=ctx.sampler,
            basis=None if basis.identity else basis,
        ),
        preprocessing={
            **UNIT_SCALE,
            "basis": basis.description,
            "postprocess": post.description if post is not None else "none",
        },
        postprocess=post,
        transform=transform,
    )
