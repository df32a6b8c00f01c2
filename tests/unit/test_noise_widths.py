"""The noise widths admission checks the secure sampler against (``Admission.noise_widths``,
issue 35 item 7) bound what the jobs draw: every sampler call of a release, on a small table
and on image-shaped data, spans no more values than its scale's declared width and is
covered relative to at least ``MIN_UNIT_SHARE`` of its scale's sensitivity."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import noise, registry
from dpcore.mechanisms.run import build, facts_of, materialise, noise_for, randomness
from tests.datasets import unit_dataset

CASES: list[tuple[str, dict[str, Any]]] = [
    ("dpmix", {}),
    ("dpcda", {}),
    ("sgdrm", {"n_samples": 40}),
    ("local_perturbation", {}),
    ("random_projection", {}),
    ("clustmix", {}),
    ("clustmix", {"model": "gaussian"}),
    ("clustmix", {"feature_map": "rff", "clusters_per_class": 3, "rff_frequencies": 16}),
    ("clustmix", {"clusters_per_class": 3, "dpkip_steps": 2, "dpkip_batch": 50}),
    ("dpgm", {"epochs": 0.2, "hidden": 4, "n_samples": 20}),
    ("dpgm", {"epochs": 0.2, "hidden": 4, "clusters_per_class": 2, "rff_frequencies": 8}),
    ("mst", {"n_samples": 50, "iterations": 5}),
]


@pytest.mark.parametrize(("mechanism", "params"), CASES, ids=lambda c: str(c))
def test_every_draw_fits_its_declared_width(
    mechanism: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    n, d, k = 600, 9, 3
    data = unit_dataset(rng.uniform(0, 1, (n, d)), rng.integers(0, k, n), k)
    spec = registry.get(mechanism)
    facts = facts_of(data)
    resolved = spec.resolve(spec.request_params.model_validate(params), facts)
    declared = noise_for(mechanism, resolved.model_dump(), facts, sigma=0.5)
    widths = spec.admission.noise_widths
    named = widths(resolved, facts) if widths is not None else {}
    row = facts.n_features + facts.n_classes
    calls: list[tuple[float, float, int, float]] = []
    draw = noise.DeclaredNoise.__call__

    def recording(self: noise.DeclaredNoise, values: torch.Tensor, **kw: Any) -> torch.Tensor:
        dim = int(values.shape[-1]) if values.ndim else 1
        unit = noise.cover_unit(kw["sensitivity"], kw.get("unit"))
        calls.append((kw["sigma"], kw["sensitivity"], dim, unit))
        return draw(self, values, **kw)

    monkeypatch.setattr(noise.DeclaredNoise, "__call__", recording)
    generator, sampler = randomness("fast")
    output = build(
        mechanism,
        resolved.model_dump(),
        data,
        noise=declared,
        sampler=sampler,
        generator=generator,
        device=torch.device("cpu"),
    )
    materialise(output)
    assert calls
    for sigma, sensitivity, dim, unit in calls:
        # Scales may share a σ: the call fits one of those it may be.
        fits = [
            s
            for s in declared.scales
            if math.isclose(sigma, s.sigma, rel_tol=1e-9) and sensitivity <= s.sensitivity * 1.01
        ]
        assert any(
            dim <= named.get(s.name, row)
            and min(unit, s.sensitivity) >= noise.MIN_UNIT_SHARE * s.sensitivity
            for s in fits
        ), (mechanism, sigma, sensitivity, dim, unit, named)
