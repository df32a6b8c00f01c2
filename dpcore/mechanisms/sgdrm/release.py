"""An SGDRM release job: unit-scale preprocessing, then random combinations with the
coefficient bound the accountant fixed (the declared noise's contribution radius)."""

from __future__ import annotations

from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.contract import UNIT_SCALE, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.postprocess import postprocessor
from dpcore.mechanisms.sgdrm.accounting import RECORD_NORM
from dpcore.mechanisms.sgdrm.generate import generate
from dpcore.mechanisms.sgdrm.params import SGDRMParams

# k of the default basis on image-shaped data (as DPMix's: one Gaussian on whole rows).
BASIS_DIM = 64


def release(params: SGDRMParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    # Signed combinations of records: scaled back to raw units but not shifted (centred).
    transform = unit_transform(data, params.clip_norm, output="centred")
    features, labels = unit_scale(data, ctx.device, transform)
    scale = ctx.noise.scale("mixtures")
    # The clip (clipped) or the lattice's radius (gaussian), exactly as the accountant set it.
    bound = ctx.noise.analysis.get("coefficient_bound", scale.sensitivity / RECORD_NORM)
    basis = basis_for(params, tuple(data.feature_shape), features.shape[1], BASIS_DIM)
    post = postprocessor(
        params.postprocess,
        sigma=scale.sigma,
        basis=basis,
        grouped=False,
        unit_box=False,  # signed combinations live outside [0, 1]
        max_norm=float("inf"),
        noisy_labels=False,  # signed combinations of labels, not distributions
    )
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
