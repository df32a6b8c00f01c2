"""Detail outside the basis (``dpcore.mechanisms.detail``, ClustMix model gaussian ``detail:
outside``): the energy statistic's sensitivity against attaining and random neighbours, its
charge in the final step, the release (the noise drawn is the noise charged; the detail lies
outside the basis with the noisy energy), admission and defaults, and an audit that catches a
statistic noised as if its sensitivity were smaller."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import detail
from dpcore.mechanisms.basis import Basis, dct_basis
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.run import facts_of
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams
from tests.unit.test_clustmix_dp import _toy
from tests.unit.test_clustmix_gaussian import GAUSS, _at, _check, _images, _release, _rows

pytestmark = pytest.mark.unit

OUTSIDE = {**GAUSS, "detail": "outside", "detail_share": 0.02}
BASIS = Basis(dct_basis((6, 6), 10), "test: 10 of 36 DCT functions")


def _total(U: torch.Tensor) -> float:
    return float(detail.total(U, BASIS.project(U))[0, 0])


def _unit(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1.0)


def test_energy_is_the_norm_outside_the_basis() -> None:
    g = torch.Generator().manual_seed(1)
    U = _unit(torch.rand((50, 36), generator=g, dtype=torch.float64) * 0.4)
    outside = U - BASIS.lift(BASIS.project(U), torch.float64)
    got = detail.energies(U, BASIS.project(U))
    torch.testing.assert_close(got, outside.pow(2).sum(1), rtol=1e-10, atol=1e-12)
    assert float(got.min()) >= 0 and float(got.max()) <= 1


def test_sensitivity_is_attained_and_never_passed() -> None:
    """A unit record all outside the basis replacing one all inside moves the sum by 1 (up to
    float rounding); random neighbours never more."""
    matrix = torch.as_tensor(np.array(BASIS.matrix))
    inside = matrix[:, 0].clone()  # the constant function: norm 1, in the basis
    full = torch.as_tensor(np.array(dct_basis((6, 6), 36)))
    outside_row = full[:, 20].clone()  # a function the basis leaves out: norm 1
    U = _unit(torch.rand((5, 36), generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    U2 = U.clone()
    U[0], U2[0] = inside, outside_row
    assert abs(_total(U) - _total(U2)) == pytest.approx(detail.SENSITIVITY, abs=1e-12)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    for trial in range(300):
        Ur = _unit(torch.randn((4, 36), generator=g, dtype=torch.float64) * (trial % 5 + 0.1))
        Up = Ur.clone()
        Up[trial % 4] = _unit(torch.randn((1, 36), generator=g, dtype=torch.float64))[0]
        worst = max(worst, abs(_total(Ur) - _total(Up)))
    assert 0 < worst <= detail.SENSITIVITY
    # Clamped: a computed term never leaves [0, 1], whatever the rows hold.
    big = torch.full((2, 36), 3.0, dtype=torch.float64)
    assert float(detail.energies(big, torch.zeros((2, 10), dtype=torch.float64)).max()) == 1.0


def test_the_final_step_charges_the_energy() -> None:
    event = _at(1.5, OUTSIDE)
    s = event.scales()
    mu2 = (
        2 / s["sums"] ** 2
        + 2 / s["counts"] ** 2
        + 2 / s["second"] ** 2
        + detail.SENSITIVITY**2 / s["detail"] ** 2
    )
    assert event.mu == pytest.approx(math.sqrt(mu2), rel=1e-12)
    # The energy takes its share of the final step's μ², the sums the rest.
    assert (1 / s["detail"] ** 2) / mu2 == pytest.approx(0.02, rel=1e-12)
    declared = {scale.name: scale for scale in event.noise().scales}
    assert declared["detail"].sensitivity == detail.SENSITIVITY
    assert event.describe()["detail_share"] == 0.02
    for keys in ({**GAUSS, "detail": "none", "detail_share": 0.3}, GAUSS):
        plain = _at(1.5, keys)
        assert "detail" not in plain.scales() and "detail_share" not in plain.describe()
    with pytest.raises(ValueError, match="detail_share"):
        ClustMixDPEvent(1.0, 0, 0.5, 0.4, moment_share=0.5, detail_share=0.2)


def test_release_draws_the_charged_noise_and_adds_detail_outside() -> None:
    params = {
        "model": "gaussian",
        "clusters_per_class": 1,
        "clip_norm": 3.0,
        "basis_dim": 10,
        "values": "model",
        "detail": "outside",
    }
    out, recorder = _release(params, sigma=0.05, data=_images())
    s = _at(0.05, {**OUTSIDE, "detail_share": 0.01}).scales()
    assert recorder.calls == [
        (pytest.approx(s["counts"]), (3, 1)),
        (pytest.approx(s["sums"]), (3, 10)),
        (pytest.approx(s["second"]), (3, 55)),
        (pytest.approx(s["detail"]), (1, 1)),
    ]
    assert "isotropic Gaussian detail" in out.preprocessing["rows"]
    X, _ = _rows(out)
    raw = out.transform.to_raw(X)
    assert raw.min() >= 0 and raw.max() <= 1 + 1e-6
    # Without the detail the same release's rows lie in the basis (before clipping); with it
    # they carry energy outside it.
    plain, _ = _release({**params, "detail": "none"}, sigma=0.05, data=_images())
    Xp, _ = _rows(plain)

    def energy_outside(rows: np.ndarray) -> float:
        x = torch.as_tensor(rows, dtype=torch.float64)
        return float((x - BASIS.lift(BASIS.project(x), torch.float64)).pow(2).sum(1).mean())

    assert energy_outside(X) > 3 * energy_outside(Xp)


def test_detail_has_the_energy_asked_for_outside_the_basis() -> None:
    outside = detail.Detail(noisy_total=30.0, n=100, basis=BASIS)  # mean energy 0.3
    assert outside.energy == pytest.approx(0.3)
    rows = torch.zeros((4000, 36), dtype=torch.float64)
    added = outside(rows, SecureRandom.from_seed(5))
    assert float(BASIS.project(added).abs().max()) < 1e-12
    assert float(added.pow(2).sum(1).mean()) == pytest.approx(0.3, rel=0.03)
    # Noisy totals outside [0, n] are clamped into a unit row's range.
    assert detail.Detail(-5.0, 100, BASIS).energy == 0.0
    assert detail.Detail(500.0, 100, BASIS).energy == 1.0


def test_admission_and_defaults() -> None:
    from dpcore.mechanisms import registry

    _check({"model": "gaussian", "basis_dim": 10, "detail": "outside"}, _images())
    with pytest.raises(InvalidParams, match="leaves none out"):
        _check({"model": "gaussian", "detail": "outside"}, _images())  # k = 36 = d
    with pytest.raises(InvalidParams, match="sum to"):
        _check(
            {"model": "gaussian", "basis_dim": 10, "detail": "outside", "detail_share": 0.45},
            _images(),
        )
    with pytest.raises(InvalidParams, match="detail_share applies to detail outside only"):
        _check({"model": "gaussian", "detail_share": 0.3}, _images())
    with pytest.raises(InvalidParams, match="detail applies to model gaussian only"):
        _check({"model": "means", "detail": "outside"}, _images())
    spec = registry.get("clustmix")

    def resolved(request: dict[str, Any], data: Any) -> Any:
        return spec.resolve(spec.request_params.model_validate(request), facts_of(data))

    # Opt-in: none by default, whatever the basis leaves out.
    assert resolved({"basis_dim": 10}, _images()).detail == "none"
    assert resolved({}, _toy()).detail == "none"
    assert resolved({"basis_dim": 10, "detail": "outside"}, _images()).detail == "outside"


def _audit(sigma_scale: float, trials: int = 20_000) -> tuple[float, float]:
    """An empirical audit of the energy step on its worst-case neighbours (record 0 all inside
    the basis in D, all outside in D′): the real ``detail.total`` and the release's sampler,
    noise σ_e·``sigma_scale`` where σ_e is what a claim of ε = 2 at δ = 10⁻² declares
    (μ = 1/σ_e); the threshold chosen on half the trials, ε bounded on the other half
    (``dpcore.audit.stats``, 95 %)."""
    from dpcore.accounting import gdp
    from dpcore.audit import stats
    from dpcore.mechanisms.noise import FastNoise

    claim, delta = 2.0, 1e-2
    sigma = detail.SENSITIVITY / gdp.mu_for_epsilon(claim, delta)
    full = torch.as_tensor(np.array(dct_basis((6, 6), 36)))
    U = _unit(torch.rand((6, 36), generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    U2 = U.clone()
    U[0], U2[0] = full[:, 0], full[:, 20]
    sampler = FastNoise(SecureRandom.from_seed(6))
    scores = []
    for rows in (U, U2):
        total = detail.total(rows, BASIS.project(rows))
        noisy = sampler(
            total.repeat(2 * trials, 1),
            sigma=sigma * sigma_scale,
            sensitivity=detail.SENSITIVITY,
            error=detail.rounding_error(6),
        )
        scores.append(noisy[:, 0].numpy())
    outcome = stats.selected_and_evaluated(scores[0], scores[1], delta, 0.05)
    return outcome.epsilon_lower_bound, claim


def test_audit_stays_below_the_claim_and_catches_too_little_noise() -> None:
    bound, claim = _audit(1.0)
    assert 1.2 < bound < claim  # below the claim, with power
    # Noised as if the statistic moved by ½ (a per-record energy halved): σ too small by 2.
    planted, _ = _audit(0.5)
    assert planted > claim


def test_schema_pins_the_detail_share() -> None:
    from dpcore.mechanisms import registry

    jsonschema = pytest.importorskip("jsonschema")
    schema = registry.get("clustmix").params.model_json_schema()
    valid = jsonschema.Draft202012Validator(schema).is_valid
    assert valid({"model": "gaussian", "detail": "outside", "detail_share": 0.1})
    assert not valid({"model": "gaussian", "detail": "none", "detail_share": 0.1})
    assert valid({"model": "gaussian", "detail": "none"})
