"""ClustMix variant dp: its accountant (every step charged), the step sensitivity against
worst-case neighbours, and the release job on a small dataset."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.accounting import gdp
from dpcore.mechanisms import registry
from dpcore.mechanisms.apportion import apportion
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.kmeans import (
    Centres,
    assign,
    kmeans_steps,
    noisy_statistics,
    survivors,
)
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import unit_features
from service.datasets.parsing import ParsedDataset
from tests.datasets import unit_dataset

pytestmark = pytest.mark.unit

TIGHT = registry.accountant("clustmix", "tight")
KEYS = {"clusters_per_class": 16, "kmeans_refine": 1, "kmeans_share": 0.5, "count_share": 0.1}


def test_steps_of_the_bisecting_schedule() -> None:
    # One step for the group sums, ⌈log₂ K⌉ splits, then the refinements; none for K = 1,
    # whose one centre per group takes every record of the group whatever it is.
    assert [kmeans_steps(k, 1) for k in (1, 2, 3, 16, 17)] == [0, 3, 4, 6, 7]
    assert kmeans_steps(16, 0) == 5
    assert kmeans_steps(1, 5) == 0


def test_one_cluster_per_class_spends_everything_on_the_final_step() -> None:
    event = TIGHT.at_sigma(3.0, {**KEYS, "clusters_per_class": 1})
    assert isinstance(event, ClustMixDPEvent) and event.kmeans_steps == 0
    s = event.scales()
    assert set(s) == {"sums", "counts"}  # no k-means noise declared
    assert event.mu == pytest.approx(math.sqrt(2 / s["sums"] ** 2 + 2 / s["counts"] ** 2))
    # Half the μ² of the same σ with K > 1 and kmeans_share 0.5.
    assert event.mu == pytest.approx(TIGHT.at_sigma(3.0, KEYS).mu / math.sqrt(2))
    assert {n.name for n in event.noise().scales} == {"sums", "counts"}


def test_mu_is_the_gdp_composition_of_every_step() -> None:
    event = TIGHT.at_sigma(3.0, KEYS)
    assert isinstance(event, ClustMixDPEvent) and event.kmeans_steps == 6
    s = event.scales()
    # Independently: each step is the Gaussian mechanism on (sums, counts), a moved record
    # moving two sums by ≤ 1 and two counts by 1.
    step = lambda sums, counts: 2 / sums**2 + 2 / counts**2  # noqa: E731
    mu2 = step(s["sums"], s["counts"]) + 6 * step(s["kmeans_sums"], s["kmeans_counts"])
    assert event.mu == pytest.approx(math.sqrt(mu2), rel=1e-12)
    # The shares are what they say: the counts take c of each step, k-means s of the total.
    assert (2 / s["counts"] ** 2) / step(s["sums"], s["counts"]) == pytest.approx(0.1)
    kmeans = 6 * step(s["kmeans_sums"], s["kmeans_counts"])
    assert kmeans / mu2 == pytest.approx(0.5)
    assert event.epsilon(1e-5) == gdp.epsilon_of(event.mu, 1e-5)
    assert event.noise().sigma_x == 3.0 and event.noise().sigma_y is None


@pytest.mark.parametrize("target", [0.2, 1.0, 10.0])
def test_calibration_never_overshoots(target: float) -> None:
    event = TIGHT.calibrate(target, 1e-5, KEYS)
    assert event.epsilon(1e-5) <= target
    assert TIGHT.at_sigma(event.sigma * (1 - 1e-6), KEYS).epsilon(1e-5) > target


def _stats(Z: np.ndarray, groups: np.ndarray, centres: Centres) -> np.ndarray:
    """One step's exact (sums, counts), flattened, scaled by the step's noise (σ_s, σ_c)."""
    identity = lambda values, **_: values  # noqa: E731
    t = torch.as_tensor(Z, dtype=torch.float64)
    a = assign(t, torch.as_tensor(groups), centres, chunk=7)
    sums, counts = noisy_statistics(
        t, a, len(centres), sigma_sums=2.0, sigma_counts=5.0, sampler=identity, error=0.0
    )
    return np.concatenate([sums.numpy().ravel() / 2.0, counts.numpy() / 5.0])


def test_step_sensitivity_against_worst_case_neighbours() -> None:
    """The μ² = 2/σ_s² + 2/σ_c² of a step is attained (a record moving between clusters) and
    never passed by random neighbours of unit-scale records."""
    bound = math.sqrt(2 / 2.0**2 + 2 / 5.0**2)
    centres = Centres(
        torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]], dtype=torch.float64),
        torch.tensor([0, 0, 1]),
    )
    rng = np.random.default_rng(5)
    others = unit_features(rng.uniform(0, 1, (20, 4)), np.zeros(4), np.ones(4))
    groups = rng.integers(0, 2, 20)
    # Attained: record 0 at e₁ in cluster 0 (class 0), replaced by e₃ in cluster 2 (class 1).
    Z, Zp = others.copy(), others.copy()
    g, gp = groups.copy(), groups.copy()
    Z[0], g[0] = [1, 0, 0, 0], 0
    Zp[0], gp[0] = [0, 0, 1, 0], 1
    moved = np.linalg.norm(_stats(Z, g, centres) - _stats(Zp, gp, centres))
    assert moved == pytest.approx(bound, rel=1e-12)
    worst = 0.0
    for _ in range(300):
        Zp, gp = Z.copy(), g.copy()
        Zp[0] = unit_features(rng.uniform(0, 1, (1, 4)), np.zeros(4), np.ones(4))[0]
        gp[0] = rng.integers(0, 2)
        worst = max(worst, float(np.linalg.norm(_stats(Z, g, centres) - _stats(Zp, gp, centres))))
    assert worst <= bound * (1 + 1e-12)


def _toy(n: int = 240, d: int = 6, k: int = 3) -> ParsedDataset:
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(k), n // k)
    X = rng.uniform(0, 1, (n, d)) * 0.3
    X[np.arange(n), labels] += 0.7  # one bright feature per class
    return unit_dataset(X, labels, k)


class Recorder:
    def __init__(self, generator: SecureRandom) -> None:
        self.inner = FastNoise(generator)
        self.calls: list[tuple[float, tuple[int, ...]]] = []
        self.name = "fast"

    def __call__(self, values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append((kwargs["sigma"], tuple(values.shape)))
        return self.inner(values, **kwargs)


def _release(params: dict[str, Any], sigma: float) -> tuple[Any, Recorder]:
    data = _toy()
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


def test_release_draws_only_the_charged_noise_and_keeps_the_domain() -> None:
    params = {"clusters_per_class": 2, "kmeans_refine": 1}
    out, recorder = _release(params, sigma=0.5)
    scales = TIGHT.at_sigma(0.5, {**KEYS, **params}).scales()
    steps = kmeans_steps(2, 1)
    # Each step noises its sums and counts once, at the declared scales, in that order.
    expected = [scales["kmeans_sums"], scales["kmeans_counts"]] * steps
    expected += [scales["sums"], scales["counts"]]
    assert [s for s, _ in recorder.calls] == pytest.approx(expected)
    rows = [(x, y) for x, y in out.chunks]
    X = torch.cat([x for x, _ in rows]).numpy()
    Y = torch.cat([y for _, y in rows]).numpy()
    assert len(X) == out.rows and 1 <= out.rows <= 6
    assert X.min() >= 0 and X.max() <= 1 and np.linalg.norm(X, axis=1).max() <= 1 + 1e-6
    assert set(Y.sum(axis=1)) == {1.0}
    # Little noise: each class's clusters light its own feature.
    for x, y in zip(X, Y, strict=True):
        assert x[: y.shape[0]].argmax() == y.argmax()


def test_n_samples_repeats_clusters_by_their_noisy_counts() -> None:
    out, _ = _release({"clusters_per_class": 2, "n_samples": 101}, sigma=0.5)
    X = torch.cat([x for x, _ in out.chunks])
    assert out.rows == 101 == len(X)


def test_apportion_is_exact_and_proportional() -> None:
    rows = apportion(np.array([10.0, 20.0, 30.5]), 7)
    assert rows.sum() == 7 and rows.tolist() == [1, 2, 4]
    assert apportion(np.array([1.0, 1.0]), 3).tolist() == [2, 1]


def test_admission_refuses_a_basis_wider_than_the_data() -> None:
    from dpcore.mechanisms.spec import InvalidParams

    spec = registry.get("clustmix")
    params = spec.params.model_validate({"basis": "dct", "basis_dim": 9})
    with pytest.raises(InvalidParams, match="basis_dim 9 exceeds"):
        spec.check(params, facts_of(_toy()))


def test_one_cluster_per_class_releases_the_noisy_class_means() -> None:
    out, recorder = _release({"clusters_per_class": 1, "kmeans_refine": 3}, sigma=0.5)
    scales = TIGHT.at_sigma(0.5, {**KEYS, "clusters_per_class": 1}).scales()
    # One step only: the final sums and counts.
    assert [s for s, _ in recorder.calls] == pytest.approx([scales["sums"], scales["counts"]])
    Y = torch.cat([y for _, y in out.chunks]).numpy()
    assert out.rows == len(Y) and sorted(Y.argmax(axis=1).tolist()) == list(range(out.rows))


def _survivors(counts: list[float], groups: list[int]) -> tuple[Centres, torch.Tensor]:
    sums = torch.tensor([[c * (i + 1.0)] for i, c in enumerate(counts)], dtype=torch.float64)
    centres = Centres(torch.zeros((len(counts), 1), dtype=torch.float64), torch.tensor(groups))
    return survivors(
        centres,
        sums,
        torch.tensor(counts, dtype=torch.float64),
        drop_below=2.0,
        sigma_counts=5.0,
    )


def test_small_clusters_pool_into_their_class_remainder() -> None:
    # Threshold 2·5 = 10. Class 0: 30 is kept; 6 and 7 pool into 13 < 2·5·√2 ≈ 14.1: dropped.
    # Class 1: 9 and 8 pool into 17 ≥ 14.1: kept at their pooled mean; nothing is kept alone.
    kept, counts = _survivors([30.0, 6.0, 7.0, 9.0, 8.0], [0, 0, 0, 1, 1])
    assert kept.groups.tolist() == [0, 1]
    assert counts.tolist() == [30.0, 17.0]
    # Pooled mean: (9·4 + 8·5)/17, the noisy sums added over the noisy counts added.
    assert kept.points[:, 0].tolist() == pytest.approx([1.0, (9 * 4 + 8 * 5) / 17])
    # A class whose pooled count is still too small is lost; an empty result is possible.
    kept, counts = _survivors([3.0, -2.0], [0, 0])
    assert len(kept) == 0 and counts.shape == (0,)


def test_spread_jitters_rows_inside_the_domain_without_more_noise() -> None:
    params = {"clusters_per_class": 2, "n_samples": 300, "spread": 0.5}
    out, recorder = _release(params, sigma=0.5)
    scales = TIGHT.at_sigma(0.5, {**KEYS, "clusters_per_class": 2}).scales()
    # The jitter is post-processing: the mechanism's noise draws are the same as without it.
    steps = kmeans_steps(2, 1)
    expected = [scales["kmeans_sums"], scales["kmeans_counts"]] * steps
    assert [s for s, _ in recorder.calls] == pytest.approx(
        [*expected, scales["sums"], scales["counts"]]
    )
    X = torch.cat([x for x, _ in out.chunks]).numpy()
    assert len(X) == out.rows == 300
    assert X.min() >= 0 and X.max() <= 1 and np.linalg.norm(X, axis=1).max() <= 1 + 1e-6
    # Distinct rows (the means alone give at most 6), spread around their means.
    assert len(np.unique(X.round(6), axis=0)) == 300
    assert "jitter" in out.preprocessing["rows"]
