"""A release's noise: the accountant's typed description, stored with the release, shown by
the API and planned by the worker."""

from __future__ import annotations

from typing import Any

from dpcore.accounting.events import NoiseDescription
from dpcore.mechanisms import registry
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.spec import PublicFacts
from service.models import Dataset, Release
from service.releases.schemas import Noise, NoiseScaleOut


def is_legacy(stored: dict[str, Any]) -> bool:
    """Rows from before migration 0009 hold only their two σ's."""
    return "scales" not in stored


def description(release: Release, dataset: Dataset) -> NoiseDescription:
    """The release's noise description; for a row stored before typed noise, rebuilt from its
    accountant at the stored σ's (the same event that was charged)."""
    stored = release.noise
    if not is_legacy(stored):
        return NoiseDescription.from_json(stored)
    spec = registry.get(release.mechanism)
    facts = PublicFacts(
        n=dataset.n_rows, n_features=dataset.n_features, n_classes=len(dataset.classes)
    )
    # Single-scale mechanisms stored σ_y = σ_x (or 0 for exact labels): not a key of theirs.
    two_scales = "sigma_y" in spec.accountant(release.accountant).key_names
    sigma_y = stored.get("sigma_y") if two_scales and stored.get("sigma_y") else None
    target = Target(
        release.accountant,
        sigma=float(stored["sigma_x"]),
        request_keys={"sigma_y": sigma_y} if sigma_y is not None else {},
    )
    return spec.event_at(target, spec.params.model_validate(release.params), facts).noise()


def to_out(stored: dict[str, Any], sampler: str) -> Noise:
    if is_legacy(stored):
        # Shown as stored: the full description is rebuilt when the job runs.
        return Noise(
            sigma_x=stored["sigma_x"],
            sigma_y=stored.get("sigma_y"),
            sampler=sampler,  # type: ignore[arg-type]
            calibrated="",
            scales=[],
        )
    described = NoiseDescription.from_json(stored)
    return from_description(described, sampler)


def from_description(described: NoiseDescription, sampler: str) -> Noise:
    return Noise(
        sigma_x=described.sigma_x,
        sigma_y=described.sigma_y,
        sampler=sampler,  # type: ignore[arg-type]
        calibrated=described.calibrated,
        scales=[NoiseScaleOut(**s.to_json()) for s in described.scales],
        analysis=dict(described.analysis),
    )
