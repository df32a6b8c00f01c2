"""Running a mechanism's release generator outside the service: what the worker does, for
benches, audits and tests (the worker itself adds storage, progress and cancellation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from dpcore.accounting.events import NoiseDescription
from dpcore.categorical import columns_of
from dpcore.mechanisms import registry
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, Report, RunContext
from dpcore.mechanisms.noise import DeclaredNoise, NoiseSampler
from dpcore.mechanisms.noise import sampler as noise_sampler
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import MechanismSpec, PublicFacts


def spec_of(mechanism: str | MechanismSpec) -> MechanismSpec:
    return registry.get(mechanism) if isinstance(mechanism, str) else mechanism


def params_of(spec: MechanismSpec, params: Mapping[str, Any] | BaseModel) -> BaseModel:
    """``params`` validated by the mechanism's own model (defaults filled in there only)."""
    if isinstance(params, spec.params):
        return params
    raw = params.model_dump() if isinstance(params, BaseModel) else dict(params)
    return spec.params.model_validate(raw)


def facts_of(data: PrivateData, **overrides: Any) -> PublicFacts:
    """The public facts of ``data`` as the service knows them (tests, benches)."""
    import numpy as np

    values: dict[str, Any] = {
        "n": data.n_rows,
        "n_features": int(data.X.shape[1]),
        "n_classes": len(data.classes),
        "feature_shape": tuple(data.feature_shape),
        "n_columns": columns_of(int(data.X.shape[1]), getattr(data, "categorical_blocks", ())),
        "class_counts": tuple(
            int(c) for c in np.bincount(data.labels, minlength=len(data.classes))
        ),
    }
    values.update(overrides)
    return PublicFacts(**values)


def noise_for(
    mechanism: str | MechanismSpec,
    params: Mapping[str, Any] | BaseModel,
    facts: PublicFacts,
    *,
    sigma: float,
    sigma_y: float | None = None,
    accountant: str | None = None,
) -> NoiseDescription:
    """The noise a release of these params adds at calibrated scale ``sigma``."""
    spec = spec_of(mechanism)
    target = Target(
        accountant or spec.accounting.default,
        sigma=sigma,
        request_keys={"sigma_y": sigma_y} if sigma_y is not None else {},
    )
    return spec.event_at(target, params_of(spec, params), facts).noise()


def randomness(sampler_name: str) -> tuple[SecureRandom, NoiseSampler]:
    """A release's randomness: one secure source under a fresh 256-bit key from the OS (never
    stored, never taken from the caller: knowing it would reveal the subsets and the noise),
    and the named noise sampler drawing from it."""
    source = SecureRandom()
    return source, noise_sampler(sampler_name, source)


def build(
    mechanism: str | MechanismSpec,
    params: Mapping[str, Any] | BaseModel,
    data: PrivateData,
    *,
    noise: NoiseDescription,
    sampler: NoiseSampler,
    generator: SecureRandom,
    device: torch.device,
    report: Report | None = None,
) -> ReleaseOutput:
    """The mechanism's release of ``data``: ``sampler`` may add only the declared ``noise``;
    ``generator`` draws every other secret choice (``randomness`` makes both for a release)."""
    if not isinstance(generator, SecureRandom):
        raise TypeError("a release draws its random choices from a SecureRandom")
    spec = spec_of(mechanism)
    if spec.execution.release is None:
        raise ValueError(f"{spec.name} has no release generator (accounting only)")
    context = RunContext(
        noise=noise,
        sampler=DeclaredNoise(sampler, noise),
        generator=generator,
        device=device,
    )
    if report is not None:
        context.report = report
    return spec.execution.release(params_of(spec, params), data, context)


def materialise(
    output: ReleaseOutput, *, raw_units: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All of a release in memory (benches, tests): (X, Y) as released — post-processed when
    the output says so — and (X_raw, Y_raw) as drawn. Features are mapped back through the
    output's transform like the worker writes them (``raw_units``; False: the mechanism's own
    scale). The worker streams instead."""
    chunks = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in output.chunks]
    if not chunks:  # a release of no rows (e.g. ClustMix with every cluster dropped)
        empty = np.zeros((0, len(output.feature_names)), dtype=np.float32)
        return empty, np.zeros((0, 0), np.float32), empty, np.zeros((0, 0), np.float32)
    X_raw = np.concatenate([c[0] for c in chunks]).astype(np.float32)
    Y_raw = np.concatenate([c[1] for c in chunks]).astype(np.float32)
    transform = output.transform if raw_units else None

    def units(x: np.ndarray) -> np.ndarray:
        return transform.to_raw(x) if transform is not None else x

    if output.postprocess is None:
        return units(X_raw), Y_raw, units(X_raw), Y_raw
    output.postprocess.fit(X_raw, Y_raw)
    X, Y = output.postprocess.transform(X_raw, Y_raw)
    return units(X), Y, units(X_raw), Y_raw
