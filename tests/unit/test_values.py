"""Matched values (``dpcore.mechanisms.values``, ClustMix model gaussian ``values: matched``):
the pooled value histogram's sensitivity against attaining and random neighbours, its charge
in the final step, the map (monotone, onto the histogram's levels, the target distribution
recovered), and the release (the noise drawn is the noise charged; values on the levels, within
the bounds)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import values
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.run import facts_of
from dpcore.mechanisms.spec import InvalidParams
from tests.unit.test_clustmix_dp import _toy
from tests.unit.test_clustmix_gaussian import GAUSS, _at, _check, _images, _release, _rows

pytestmark = pytest.mark.unit

MATCHED = {**GAUSS, "values": "matched", "value_share": 0.05}


def _delta(X: torch.Tensor, X2: torch.Tensor) -> float:
    return float((values.histogram(X) - values.histogram(X2)).norm())


def test_sensitivity_is_attained_and_never_passed() -> None:
    """Replacing a record whose values all sit in one level by one whose values all sit in
    another moves the histogram by exactly √2; random neighbours (any values, any d) never
    more."""
    X = torch.rand((5, 9), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    X2 = X.clone()
    X[0], X2[0] = 0.0, 1.0
    assert _delta(X, X2) == pytest.approx(values.SENSITIVITY, rel=1e-12)
    assert math.sqrt(2.0) == values.SENSITIVITY
    g = torch.Generator().manual_seed(2)
    worst = 0.0
    for trial in range(300):
        d = 1 + trial % 13
        Xr = torch.rand((4, d), generator=g, dtype=torch.float64) ** (1 + trial % 3)
        Xp = Xr.clone()
        Xp[trial % 4] = torch.rand(d, generator=g, dtype=torch.float64) ** (trial % 5 + 1)
        worst = max(worst, _delta(Xr, Xp))
    assert 0 < worst <= values.SENSITIVITY * (1 + 1e-12)


def test_histogram_levels_and_mass() -> None:
    X = torch.tensor([[0.0, 1.0, 0.5, 0.2], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    h = values.histogram(X)
    assert h.shape == (1, values.BINS) and h.dtype == torch.float64
    assert float(h.sum()) == pytest.approx(2.0)  # each record weighs 1
    assert float(h[0, 0]) == pytest.approx(0.25 + 0.5)
    assert float(h[0, 255]) == pytest.approx(0.25 + 0.5)
    assert float(h[0, 128]) == pytest.approx(0.25)  # round(0.5 · 255) = 128
    assert float(h[0, 51]) == pytest.approx(0.25)
    # Values outside [0, 1] count at the nearest end (the parsed data are clipped already).
    assert float(values.histogram(torch.tensor([[-1.0, 2.0]]))[0, [0, 255]].sum()) == 1.0


def test_the_map_recovers_the_target_distribution() -> None:
    """An exact histogram of sparse, bright 'images' and hazy Gaussian samples: the mapped
    samples take the target's fraction at 0 and its quantiles, monotonically, on its levels."""
    rng = np.random.default_rng(0)
    target = np.where(rng.random((2000, 50)) < 0.2, rng.uniform(0.6, 1.0, (2000, 50)), 0.0)
    hist = values.histogram(torch.as_tensor(target))
    samples = torch.as_tensor(rng.normal(0.3, 0.2, (1500, 50)).clip(0, 1))
    reference = torch.as_tensor(rng.normal(0.3, 0.2, (4000, 50)).clip(0, 1))
    mapped = values.ValueMap(hist, 2000, reference)(samples).numpy()
    assert (mapped == 0).mean() == pytest.approx((target == 0).mean(), abs=0.01)
    lit = mapped[mapped > 0]
    assert np.quantile(lit, [0.1, 0.5, 0.9]) == pytest.approx(
        np.quantile(target[target > 0], [0.1, 0.5, 0.9]), abs=0.02
    )
    levels = mapped * (values.BINS - 1)
    assert np.allclose(levels, np.round(levels))
    order = np.argsort(samples.numpy().ravel())
    assert (np.diff(mapped.ravel()[order]) >= 0).all()  # monotone in the sampled value
    half = values.ValueMap(hist, 2000, reference, blend=0.5)(samples).numpy()
    assert half == pytest.approx(0.5 * samples.numpy() + 0.5 * mapped)


def test_noisy_levels_give_a_monotone_distribution() -> None:
    """Negative noisy levels and a total off n: the running sum is made monotone, clipped to
    [0, 1], and ends at 1, so every rank finds a level."""
    noisy = torch.zeros(values.BINS, dtype=torch.float64)
    noisy[0], noisy[10], noisy[11], noisy[200] = 50.0, -30.0, 20.0, 80.0
    vm = values.ValueMap(noisy, 100, torch.linspace(0, 1, 11))
    assert (torch.diff(vm.cdf) >= 0).all() and float(vm.cdf[-1]) == 1.0
    assert float(vm.cdf.min()) >= 0.0
    out = vm(torch.linspace(0, 1, 101))
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    with pytest.raises(ValueError, match="blend"):
        values.ValueMap(noisy, 100, torch.ones(3), blend=1.5)


def test_the_final_step_charges_the_histogram() -> None:
    event = _at(3.0, MATCHED)
    s = event.scales()
    assert set(s) == {"sums", "counts", "second", "values"}
    mu2 = 2 / s["sums"] ** 2 + 2 / s["counts"] ** 2 + 2 / s["second"] ** 2 + 2 / s["values"] ** 2
    assert event.mu**2 == pytest.approx(mu2, rel=1e-12)
    assert (2 / s["values"] ** 2) / event.mu**2 == pytest.approx(0.05)
    assert (2 / s["sums"] ** 2) / event.mu**2 == pytest.approx(1 - 0.1 - 0.5 - 0.05)
    noise = event.noise()
    assert [n.name for n in noise.scales] == ["sums", "counts", "second", "values"]
    declared = {n.name: n for n in noise.scales}["values"]
    assert declared.sensitivity == values.SENSITIVITY and declared.sigma == s["values"]
    assert event.describe()["value_share"] == 0.05
    assert "value histogram" in event.describe()["covers"]
    # Values model (or the key absent): the event of before, no histogram.
    for keys in ({**GAUSS, "values": "model", "value_share": 0.3}, GAUSS):
        plain = _at(3.0, keys)
        assert "values" not in plain.scales() and "value_share" not in plain.describe()
    with pytest.raises(ValueError, match="value_share"):
        ClustMixDPEvent(1.0, 0, 0.5, 0.4, moment_share=0.5, value_share=0.2)


def test_release_draws_the_charged_noise_onto_the_levels() -> None:
    params = {
        "model": "gaussian",
        "clusters_per_class": 1,
        "clip_norm": 3.0,
        "values": "matched",
        "value_blend": 1.0,
    }
    out, recorder = _release(params, sigma=0.2, data=_images())
    s = _at(0.2, {**MATCHED, "clusters_per_class": 1}).scales()
    assert recorder.calls == [
        (pytest.approx(s["counts"]), (3, 1)),
        (pytest.approx(s["sums"]), (3, 36)),
        (pytest.approx(s["second"]), (3, 666)),
        (pytest.approx(s["values"]), (1, values.BINS)),
    ]
    X, _ = _rows(out)
    assert len(X) == 300 and X.shape[1] == 36
    raw = out.transform.to_raw(X)  # declared bounds [0, 1]
    assert raw.min() >= 0 and raw.max() <= 1 + 1e-6
    levels = raw * (values.BINS - 1)
    assert np.abs(levels - np.round(levels)).max() < 1e-3  # float32 unit scale, then raw
    assert len(np.unique(X.round(6), axis=0)) >= 0.9 * len(X)
    assert "noisy histogram of the records' values" in out.preprocessing["rows"]
    # Blended: no longer on the levels, still within the bounds.
    out, _ = _release({**params, "value_blend": 0.5}, sigma=0.2, data=_images())
    X, _ = _rows(out)
    raw = out.transform.to_raw(X)
    assert raw.min() >= 0 and raw.max() <= 1 + 1e-6
    assert "blended 0.5" in out.preprocessing["rows"]


def test_an_unset_blend_follows_the_fits_shrinkage() -> None:
    assert values.automatic_blend([]) == 0.5
    assert values.automatic_blend([1.0, 0.9]) == 0.5
    assert values.automatic_blend([0.8]) == 0.5
    assert values.automatic_blend([0.6, 0.6]) == pytest.approx(0.8)
    assert values.automatic_blend([0.5]) == 1.0
    assert values.automatic_blend([0.1, 0.3]) == 1.0
    params = {"model": "gaussian", "clusters_per_class": 1, "clip_norm": 3.0, "values": "matched"}
    # Little noise: the covariances are kept (λ small), every value on the data's levels.
    out, _ = _release(params, sigma=1e-3, data=_images())
    levels = out.transform.to_raw(_rows(out)[0]) * (values.BINS - 1)
    assert np.abs(levels - np.round(levels)).max() < 1e-3
    assert "blended" not in out.preprocessing["rows"]
    # Much noise: the covariances are mostly shrunk away (λ near 1), half the matched level.
    out, _ = _release(params, sigma=2.0, data=_images())
    assert "blended 0.5 with the model value (w = clamp(" in out.preprocessing["rows"]


def test_admission_and_defaults() -> None:
    from dpcore.mechanisms import registry

    _check({"model": "gaussian", "values": "matched"}, _images())
    with pytest.raises(InvalidParams, match="needs image-shaped data"):
        _check({"model": "gaussian", "values": "matched"})
    with pytest.raises(InvalidParams, match=r"\+ value_share 0.45 must be < 1"):
        _check({"model": "gaussian", "values": "matched", "value_share": 0.45}, _images())
    with pytest.raises(InvalidParams, match="value_blend applies to values matched only"):
        _check({"model": "gaussian", "value_blend": 0.3}, _images())
    with pytest.raises(InvalidParams, match="values applies to model gaussian only"):
        _check({"model": "means", "values": "matched"}, _images())
    spec = registry.get("clustmix")

    def resolved(request: dict[str, Any], data: Any) -> Any:
        return spec.resolve(spec.request_params.model_validate(request), facts_of(data))

    assert resolved({}, _images()).values == "matched"
    assert resolved({}, _toy()).values == "model"
    assert resolved({"model": "means"}, _images()).values == "model"
    assert resolved({"values": "model"}, _images()).values == "model"


def _audit(sigma_scale: float, trials: int = 20_000) -> tuple[float, float]:
    """An empirical audit of the histogram step on its worst-case neighbours (record 0's
    values all at level 0 in D, all at level 255 in D′): the real ``values.histogram`` and the
    release's sampler, noise σ_v·``sigma_scale`` where σ_v is what a claim of ε = 2 at
    δ = 10⁻² declares (μ = √2/σ_v); each trial one independent release (a row of its own
    noise). The test scores ⟨release, Δ⟩ (Δ the exact difference), picks its threshold on one
    half of the trials and bounds ε on the other (``dpcore.audit.stats``, 95 %)."""
    from dpcore.accounting import gdp
    from dpcore.audit import stats
    from dpcore.mechanisms.noise import FastNoise
    from dpcore.mechanisms.secure_random import SecureRandom

    claim, delta = 2.0, 1e-2
    sigma = values.SENSITIVITY / gdp.mu_for_epsilon(claim, delta)
    rng = torch.Generator().manual_seed(5)
    X = torch.rand((6, 8), generator=rng, dtype=torch.float64)
    X2 = X.clone()
    X[0], X2[0] = 0.0, 1.0
    exact = values.histogram(X), values.histogram(X2)
    direction = (exact[1] - exact[0])[0]
    sampler = FastNoise(SecureRandom.from_seed(6))
    scores = []
    for hist in exact:
        noisy = sampler(
            hist.repeat(2 * trials, 1),
            sigma=sigma * sigma_scale,
            sensitivity=values.SENSITIVITY,
            error=values.rounding_error(6),
        )
        scores.append((noisy @ direction).numpy())
    outcome = stats.selected_and_evaluated(scores[0], scores[1], delta, 0.05)
    return outcome.epsilon_lower_bound, claim


def test_audit_stays_below_the_claim_and_catches_too_little_noise() -> None:
    bound, claim = _audit(1.0)
    assert 1.2 < bound < claim  # below the claim, with power
    # Calibrated as if a record moved the histogram by 1 (its own p only): σ too small by √2.
    planted, _ = _audit(1 / math.sqrt(2))
    assert planted > claim


def test_schema_pins_the_matched_fields() -> None:
    """A body the schema allows is one admission accepts: the histogram's fields only with
    values matched set."""
    from dpcore.mechanisms import registry

    jsonschema = pytest.importorskip("jsonschema")
    schema = registry.get("clustmix").params.model_json_schema()
    valid = jsonschema.Draft202012Validator(schema).is_valid
    assert valid({"model": "gaussian", "values": "matched", "value_share": 0.1, "value_blend": 1})
    assert not valid({"model": "gaussian", "values": "model", "value_blend": 1})
    assert not valid({"model": "gaussian", "value_share": 0.1})
    assert valid({"model": "gaussian", "values": "model"})
