"""ClustMix variant dp, model gaussian: the final step's noisy second moments charged by the
accountant (μ² against attaining and random neighbours, calibration), the admission rules,
and the release job (the noise drawn is the noise charged; rows distinct, in the domain,
exactly labelled)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import moments, registry
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.kmeans import kmeans_steps
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams
from service.datasets.parsing import ParsedDataset
from tests.datasets import unit_dataset
from tests.unit.test_clustmix_dp import Recorder, _toy

pytestmark = pytest.mark.unit

TIGHT = registry.accountant("clustmix", "tight")
MEANS = {"clusters_per_class": 16, "kmeans_refine": 1, "kmeans_share": 0.5, "count_share": 0.1}
GAUSS = {**MEANS, "clusters_per_class": 1, "model": "gaussian", "moment_share": 0.5}


def _at(sigma: float, keys: dict[str, Any]) -> ClustMixDPEvent:
    event = TIGHT.at_sigma(sigma, keys)
    assert isinstance(event, ClustMixDPEvent)
    return event


def _final_mu2(s: dict[str, float]) -> float:
    return 2 / s["sums"] ** 2 + 2 / s["counts"] ** 2 + 2 / s["second"] ** 2


def test_final_step_charges_the_second_moments() -> None:
    event = _at(3.0, GAUSS)
    assert isinstance(event, ClustMixDPEvent) and event.kmeans_steps == 0
    s = event.scales()
    assert set(s) == {"sums", "counts", "second"}
    assert s["sums"] == 3.0
    assert event.mu**2 == pytest.approx(_final_mu2(s), rel=1e-12)
    # The shares are what they say: counts c, second moments m, sums the rest.
    assert (2 / s["counts"] ** 2) / event.mu**2 == pytest.approx(0.1)
    assert (2 / s["second"] ** 2) / event.mu**2 == pytest.approx(0.5)
    assert (2 / s["sums"] ** 2) / event.mu**2 == pytest.approx(0.4)
    noise = event.noise()
    assert [n.name for n in noise.scales] == ["sums", "counts", "second"]
    assert noise.sigma("second") == s["second"] and noise.calibrated == "sums"
    assert event.describe()["moment_share"] == 0.5


def test_kmeans_steps_keep_their_share_beside_the_gaussian_step() -> None:
    keys = {**GAUSS, "clusters_per_class": 16}
    event = _at(2.0, keys)
    assert isinstance(event, ClustMixDPEvent) and event.kmeans_steps == 6
    s = event.scales()
    kmeans = 6 * (2 / s["kmeans_sums"] ** 2 + 2 / s["kmeans_counts"] ** 2)
    assert event.mu**2 == pytest.approx(_final_mu2(s) + kmeans, rel=1e-12)
    assert kmeans / event.mu**2 == pytest.approx(0.5)


def test_model_means_is_unchanged() -> None:
    """Model means reads no moment_share: the same event, scales and description as before
    the field existed (the key absent, or present at any value)."""
    for sigma in (0.7, 3.0):
        base = _at(sigma, MEANS)
        for extra in ({"model": "means"}, {"model": "means", "moment_share": 0.3}):
            event = _at(sigma, {**MEANS, **extra})
            assert event == base
            assert event.mu == base.mu and event.scales() == base.scales()
            assert event.describe() == base.describe()
            assert "moment_share" not in event.describe()
            assert "second" not in event.scales()


def _stats(X: torch.Tensor, classes: torch.Tensor, clusters: int) -> moments.NoisyMoments:
    """The gaussian step's exact statistics (one cluster per class, identity basis)."""
    exact = lambda values, **_: values.double()  # noqa: E731
    Z = moments.unit_rows(X, 1.0)
    return moments.noisy_moments(
        Z,
        classes,
        torch.arange(clusters),
        second_dim=Z.shape[1],
        scales=moments.Scales(counts=1.0, sums=1.0, second=1.0),
        sampler=exact,  # type: ignore[arg-type]
    )


def _moved(a: moments.NoisyMoments, b: moments.NoisyMoments, s: dict[str, float]) -> float:
    """‖Δ‖² of the released blocks in the event's noise units."""
    return float(
        ((a.counts - b.counts) ** 2).sum() / s["counts"] ** 2
        + ((a.sums - b.sums) ** 2).sum() / s["sums"] ** 2
        + ((a.second - b.second) ** 2).sum() / s["second"] ** 2
    )


@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_declared_mu2_is_attained_and_never_passed(share: float) -> None:
    """The released blocks of neighbours, computed by the step's own function: a record at e₁
    (class 0) replaced by e₂ (class 1) moves them by exactly the declared μ²; replaced within
    its class (e₁ → e₂) by 2/σ_s² + 2/σ₂² < μ²; random unit-scale neighbours never more."""
    keys = {**GAUSS, "moment_share": share, "count_share": 0.1}
    event = _at(1.7, keys)
    s = event.scales()
    mu2 = event.mu**2
    X = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0.5, 0.5], [0, 0.3, 0, 0.9]], dtype=torch.float64)
    X2 = X.clone()
    X2[0] = torch.tensor([0, 1.0, 0, 0])
    y = torch.tensor([0, 0, 1])
    moved = _moved(_stats(X, y, 2), _stats(X2, torch.tensor([1, 0, 1]), 2), s)
    assert moved == pytest.approx(mu2, rel=1e-12)
    same = _moved(_stats(X, y, 2), _stats(X2, y, 2), s)
    assert same == pytest.approx(2 / s["sums"] ** 2 + 2 / s["second"] ** 2, rel=1e-12)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    for trial in range(200):
        Xr = torch.rand((6, 4), generator=g, dtype=torch.float64) ** 2
        yr = torch.randint(0, 3, (6,), generator=g)
        Xp, yp = Xr.clone(), yr.clone()
        Xp[0] = torch.rand(4, generator=g, dtype=torch.float64) ** (trial % 4 + 1)
        yp[0] = torch.randint(0, 3, (1,), generator=g)
        worst = max(worst, _moved(_stats(Xr, yr, 3), _stats(Xp, yp, 3), s))
    assert 0 < worst <= mu2 * (1 + 1e-12)


@pytest.mark.parametrize("clusters", [1, 16])
@pytest.mark.parametrize("target", [0.2, 1.0, 10.0])
def test_calibration_never_overshoots(target: float, clusters: int) -> None:
    keys = {**GAUSS, "clusters_per_class": clusters}
    event = TIGHT.calibrate(target, 1e-5, keys)
    assert isinstance(event, ClustMixDPEvent)
    assert event.epsilon(1e-5) <= target
    assert _at(event.sigma * (1 - 1e-6), keys).epsilon(1e-5) > target


def _release(params: dict[str, Any], sigma: float, data: ParsedDataset | None = None) -> Any:
    data = data if data is not None else _toy()
    noise = noise_for("clustmix", params, facts_of(data), sigma=sigma)
    generator = SecureRandom.from_seed(4)
    recorder = Recorder(generator)
    out = build(
        "clustmix",
        params,
        data,
        noise=noise,
        sampler=recorder,
        generator=generator,
        device=torch.device("cpu"),
    )
    return out, recorder


def _rows(out: Any) -> tuple[np.ndarray, np.ndarray]:
    chunks = list(out.chunks)
    X = torch.cat([x for x, _ in chunks]).numpy()
    Y = torch.cat([y for _, y in chunks]).numpy()
    return X, Y


@pytest.mark.parametrize("clip", [1.0, 2.0])
def test_release_draws_the_charged_noise_and_samples_n_rows(clip: float) -> None:
    params = {"model": "gaussian", "clusters_per_class": 1, "clip_norm": clip}
    out, recorder = _release(params, sigma=0.3)
    s = _at(0.3, {**GAUSS, "clusters_per_class": 1}).scales()
    # One step: counts, sums and second moments, each once, at the declared scales; 3 classes
    # of 6 features: sums (3, 6), triangles (3, 21).
    assert recorder.calls == [
        (pytest.approx(s["counts"]), (3, 1)),
        (pytest.approx(s["sums"]), (3, 6)),
        (pytest.approx(s["second"]), (3, 21)),
    ]
    X, Y = _rows(out)
    assert out.rows == len(X) == len(Y) == 240  # n_samples None: n rows
    # The domain: unit scale, every feature in [0, 1/C] (raw [lo, hi]), norm ≤ 1.
    assert X.min() >= 0 and X.max() <= 1 / clip + 1e-6
    assert np.linalg.norm(X, axis=1).max() <= 1 + 1e-6
    raw = out.transform.to_raw(X)
    assert raw.min() >= 0 and raw.max() <= 1 + 1e-6
    # Distinct rows, exact one-hot labels, classes in proportion, each lighting its feature.
    assert len(np.unique(X.round(6), axis=0)) >= 0.9 * len(X)
    assert set(Y.sum(axis=1)) == {1.0} and set(np.unique(Y)) == {0.0, 1.0}
    assert np.bincount(Y.argmax(axis=1), minlength=3).tolist() == pytest.approx([80] * 3, abs=3)
    agree = (X[:, :3].argmax(axis=1) == Y.argmax(axis=1)).mean()
    assert agree >= 0.8
    assert "Gaussians" in out.preprocessing["rows"]


def test_release_with_kmeans_and_n_samples() -> None:
    params = {"model": "gaussian", "clusters_per_class": 2, "kmeans_refine": 1, "n_samples": 77}
    out, recorder = _release(params, sigma=0.3)
    s = _at(0.3, {**GAUSS, "clusters_per_class": 2}).scales()
    steps = kmeans_steps(2, 1)
    expected = [s["kmeans_sums"], s["kmeans_counts"]] * steps
    expected += [s["counts"], s["sums"], s["second"]]
    assert [sigma for sigma, _ in recorder.calls] == pytest.approx(expected)
    X, Y = _rows(out)
    assert out.rows == len(X) == 77
    assert X.min() >= 0 and X.max() <= 1 + 1e-6 and set(Y.sum(axis=1)) == {1.0}


def _images(n: int = 300, side: int = 6, k: int = 3) -> ParsedDataset:
    rng = np.random.default_rng(7)
    labels = np.arange(n) % k
    X = rng.uniform(0, 0.2, (n, side * side))
    for c in range(k):
        X[labels == c, c * 12 : c * 12 + 12] += 0.7
    return dataclasses.replace(
        unit_dataset(np.clip(X, 0, 1), labels, k), feature_shape=(side, side)
    )


def test_release_in_a_dct_basis_with_fewer_modelled_coordinates() -> None:
    params = {
        "model": "gaussian",
        "clusters_per_class": 1,
        "basis": "dct",
        "basis_dim": 16,
        "moment_dim": 5,
        "clip_norm": 3.0,
    }
    out, recorder = _release(params, sigma=0.2, data=_images())
    # Sums over the 16 coefficients, second moments over the first 5 (15 triangle entries).
    assert [shape for _, shape in recorder.calls] == [(3, 1), (3, 16), (3, 15)]
    X, _ = _rows(out)
    assert len(X) == 300 and X.shape[1] == 36
    assert X.min() >= 0 and X.max() <= 1 / 3 + 1e-6
    assert np.linalg.norm(X, axis=1).max() <= 1 + 1e-6
    assert len(np.unique(X.round(6), axis=0)) >= 270
    assert "first 5 basis coordinates" in out.preprocessing["rows"]


def _check(params: dict[str, Any], data: ParsedDataset | None = None) -> None:
    spec = registry.get("clustmix")
    spec.check(spec.params.model_validate(params), facts_of(data or _toy()))


def test_admission_rules() -> None:
    _check({"model": "gaussian", "clusters_per_class": 1})
    with pytest.raises(InvalidParams, match="spread applies to model means only"):
        _check({"model": "gaussian", "spread": 0.5})
    with pytest.raises(InvalidParams, match=r"count_share 0.5 \+ moment_share 0.5 must be < 1"):
        _check({"model": "gaussian", "count_share": 0.5, "moment_share": 0.5})
    with pytest.raises(InvalidParams, match="moment_dim 7 exceeds the basis dimension 6"):
        _check({"model": "gaussian", "moment_dim": 7})
    _check({"model": "gaussian", "moment_dim": 6})
    with pytest.raises(InvalidParams, match="moment_dim 20 exceeds the basis dimension 16"):
        _check({"model": "gaussian", "basis": "dct", "basis_dim": 16, "moment_dim": 20}, _images())
    with pytest.raises(InvalidParams, match="moment_share applies to model gaussian only"):
        _check({"moment_share": 0.3})
    with pytest.raises(InvalidParams, match="model, moment_dim do not apply to variant paper"):
        _check({"variant": "paper", "model": "gaussian", "moment_dim": 4, "cluster_size": 5})


def test_schema_pins_the_gaussian_rules() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = registry.get("clustmix").params.model_json_schema()
    valid = jsonschema.Draft202012Validator(schema).is_valid
    assert valid({"model": "gaussian", "moment_share": 0.3, "moment_dim": 8})
    assert not valid({"model": "gaussian", "spread": 0.5})
    assert not valid({"moment_share": 0.3})
    assert not valid({"variant": "paper", "model": "gaussian"})
    assert valid({"spread": 0.5})


def test_clusters_default_is_one_for_model_gaussian() -> None:
    from dpcore.mechanisms.clustmix import clusters_default

    facts = facts_of(unit_dataset(np.zeros((40000, 2)), np.arange(40000) % 4, 4))
    assert clusters_default({}, facts) == 16
    assert clusters_default({"model": "gaussian"}, facts) == 1


def test_moment_dim_default_fits_the_basis() -> None:
    from dpcore.mechanisms.clustmix.params import ClustMixParams
    from dpcore.mechanisms.clustmix.release import moment_dim

    assert moment_dim(ClustMixParams(model="gaussian"), 6) == 6
    assert moment_dim(ClustMixParams(model="gaussian"), 400) == 128
    assert moment_dim(ClustMixParams(model="gaussian", moment_dim=9), 400) == 9


@pytest.mark.parametrize(
    ("shape", "request_params", "expected"),
    [
        # A request that says nothing gets model gaussian: one Gaussian per class, C = ⌈√d⌉/4
        # on images, the table rule (⌈√d⌉/2) otherwise.
        ((28, 28), {}, {"model": "gaussian", "clusters_per_class": 1, "clip_norm": 7.0}),
        ((784,), {}, {"model": "gaussian", "clusters_per_class": 1, "clip_norm": 14.0}),
        ((30,), {}, {"model": "gaussian", "clusters_per_class": 1, "clip_norm": 3.0}),
        # spread is an option of model means: asking for it keeps model means and its rules.
        ((28, 28), {"spread": 0.5}, {"model": "means", "clusters_per_class": 16}),
        ((28, 28), {"model": "means"}, {"clusters_per_class": 16, "clip_norm": 28 / 3}),
        ((28, 28), {"variant": "paper"}, {"model": "means"}),
        ((28, 28), {"clip_norm": 5.0}, {"model": "gaussian", "clip_norm": 5.0}),
    ],
)
def test_request_defaults(
    shape: tuple[int, ...], request_params: dict[str, Any], expected: dict[str, Any]
) -> None:
    from dpcore.mechanisms.spec import PublicFacts

    spec = registry.get("clustmix")
    d = int(np.prod(shape))
    facts = PublicFacts(n=10_000, n_features=d, n_classes=10, feature_shape=shape)
    resolved = spec.resolve(spec.request_params.model_validate(request_params), facts)
    spec.check(resolved, facts)
    got = resolved.model_dump()
    for name, value in expected.items():
        assert got[name] == (pytest.approx(value) if isinstance(value, float) else value), name
