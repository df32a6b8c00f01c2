"""DPGM's mechanism: per-record gradients in closed form against autograd, the sampler the
accountant assumes, the step's sensitivity against worst-case neighbours, DPNorm, and the
release end to end (shapes, exact labels, weights, progress, cancel)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.func import grad, vmap

from dpcore.mechanisms import registry
from dpcore.mechanisms.dpgm import accounting
from dpcore.mechanisms.dpgm.dpsgd import (
    GRADIENT_SENSITIVITY,
    Descent,
    SGDSettings,
    dpnorm,
    histogram_bins,
    noisy_step,
    train,
)
from dpcore.mechanisms.dpgm.models import RBM, VAE
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.run import build, facts_of, materialise, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import Cancelled, InvalidParams
from tests.datasets import unit_dataset

torch.set_default_dtype(torch.float32)


def _normal(seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randn(shape, generator=gen)


def _identity(values: torch.Tensor, **_: Any) -> torch.Tensor:
    return values


def test_vae_norms_and_clipped_sums_match_autograd_per_record() -> None:
    net = VAE(d=7, hidden=5, latent=2)
    params = {k: v.double() for k, v in net.init(3, _normal(0)).items()}
    x = torch.rand((6, 7), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    a = torch.tensor([0, 2, 2, 1, 0, 2])
    eps = torch.randn((6, 2), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    norms, clip_sum = net.gradients(params, x, a, lambda shape: eps)

    def loss(p: dict[str, torch.Tensor], row: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # An independent write-up of the per-record negative ELBO over d.
        h = torch.relu(row @ p["enc_w"] + p["enc_b"])
        mu, logvar = h @ p["mu_w"] + p["mu_b"], (h @ p["lv_w"] + p["lv_b"]).clamp(-10, 10)
        z = mu + torch.exp(0.5 * logvar) * e
        logits = torch.relu(z @ p["dec_w1"] + p["dec_b1"]) @ p["dec_w2"] + p["dec_b2"]
        rec = torch.nn.functional.binary_cross_entropy_with_logits(logits, row, reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu * mu - torch.exp(logvar))
        return (rec + kl) / row.shape[0]

    factors = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.1, 0.7], dtype=torch.float64)
    sums = clip_sum(factors)
    for i in range(6):
        own = {k: v[int(a[i])] for k, v in params.items()}
        g = grad(loss)(own, x[i], eps[i])
        flat = torch.cat([g[k].reshape(-1) for k in net.names()])
        assert float(norms[i]) == pytest.approx(float(flat.norm()), rel=1e-9)
    for m in range(3):
        mine = torch.nonzero(a == m)[:, 0]
        for k in net.names():
            expected = sum(
                factors[i] * grad(loss)({q: v[m] for q, v in params.items()}, x[i], eps[i])[k]
                for i in mine.tolist()
            )
            assert torch.allclose(sums[k][m], torch.as_tensor(expected).double(), atol=1e-10)
    # vmap agrees too (what the closed form replaces).
    own0 = {k: v[0] for k, v in params.items()}
    batched = vmap(grad(loss), in_dims=(None, 0, 0))(own0, x[a == 0], eps[a == 0])
    assert batched["enc_w"].shape == (2, 7, 5)


def test_rbm_norms_and_clipped_sums_match_the_explicit_gradients() -> None:
    net = RBM(d=6, hidden=4, chains=5)
    params = {k: v.double() for k, v in net.init(2, _normal(3)).items()}
    params["W"] = params["W"] * 50  # away from zero, so every term matters
    net.state = (torch.rand((2, 5, 6), generator=torch.Generator().manual_seed(4)) < 0.5).double()
    x = torch.rand((5, 6), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a = torch.tensor([1, 0, 1, 1, 0])
    norms, clip_sum = net.gradients(params, x, a, _normal(6))
    factors = torch.tensor([0.3, 1.0, 0.9, 0.2, 0.6], dtype=torch.float64)
    sums = clip_sum(factors)
    for m in range(2):
        W, c = params["W"][m], params["c"][m]
        v = net.state[m]
        qh = torch.sigmoid(v @ W + c)
        NW, Nb, Nc = v.T @ qh / 5, v.mean(0), qh.mean(0)
        total = {k: torch.zeros_like(params[k][m]) for k in ("W", "b", "c")}
        for i in torch.nonzero(a == m)[:, 0].tolist():
            p = torch.sigmoid(x[i] @ W + c)
            g = {"W": -(torch.outer(x[i], p) - NW), "b": -(x[i] - Nb), "c": -(p - Nc)}
            flat = torch.cat([g[k].reshape(-1) for k in ("W", "b", "c")])
            assert float(norms[i]) == pytest.approx(float(flat.norm()), rel=1e-9)
            for k in total:
                total[k] += factors[i] * g[k]
        for k in total:
            assert torch.allclose(sums[k][m], total[k], atol=1e-10)


def test_dpnorm_bins_are_the_papers_upper_edges() -> None:
    norms = torch.tensor([0.0, 0.1, 0.2, 0.21, 1.0, 1.5, 9.0], dtype=torch.float64)
    assert histogram_bins(norms, 1.0, 10).tolist() == [0, 0, 1, 2, 9, 9, 9]
    # Without noise the mode's upper edge: three norms in (0.9, 1] (plus the clamped ones).
    assert dpnorm(norms, clip_max=1.0, bins=10, sigma=1.0, sampler=_identity) == 1.0
    calls: list[dict[str, Any]] = []

    def recording(values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        calls.append({"shape": tuple(values.shape), **kwargs})
        return values

    dpnorm(norms, clip_max=1.0, bins=10, sigma=3.0, sampler=recording)
    # The cover is relative to one record's one-hot entry (the subsampled Gaussian's radius).
    assert calls == [{"shape": (1, 10), "sigma": 3.0, "sensitivity": math.sqrt(2.0), "unit": 1.0}]


def _settings(**overrides: Any) -> SGDSettings:
    values: dict[str, Any] = {
        "steps": 1,
        "batch": 3,
        "sigma": 1.0,
        "sigma_norm": 1.0,
        "clip_max": 0.2,
        "bins": 4,
        "lr": 1e-3,
    }
    values.update(overrides)
    return SGDSettings(**values)


def test_a_replaced_record_moves_the_step_by_at_most_two_clip_units() -> None:
    """Neighbours: record 0 replaced, in the same network or moved to another. Without noise the
    step's vector (units of C) moves by ≤ 2 (the accountant's replace-one shift: two clipped
    gradients, antipodal at worst); moved between networks, the two land in different blocks:
    exactly √2 when both are clipped."""
    net = VAE(d=5, hidden=4, latent=2)
    params = net.init(3, _normal(7))
    gen = torch.Generator().manual_seed(8)
    worst = 0.0
    for trial in range(20):
        X = torch.rand((8, 5), generator=gen)
        X2 = X.clone()
        X2[0] = torch.rand(5, generator=gen)
        a = torch.randint(0, 3, (8,), generator=gen)
        a2 = a.clone()
        moved = trial % 2 == 0
        a2[0] = (a[0] + 1) % 3 if moved else a[0]
        rows = torch.arange(8)
        out = [
            noisy_step(
                net,
                params,
                data,
                assignment,
                rows,
                _settings(clip_max=1e-3, bins=2),
                sampler=_identity,
                normal=_normal(trial),
                error=0.0,
            )
            for data, assignment in ((X, a), (X2, a2))
        ]
        assert out[0][1] == out[1][1]  # the same threshold (every norm in the last bin)
        shift = float((out[0][0] - out[1][0]).norm())
        assert shift <= GRADIENT_SENSITIVITY * (1 + 1e-9)
        if moved:
            assert shift == pytest.approx(math.sqrt(2.0), rel=1e-9)
        worst = max(worst, shift)
    assert worst > math.sqrt(2.0)


def test_poisson_batches_are_exact_bernoulli_draws_from_the_secure_source() -> None:
    calls: list[tuple[int, int, tuple[int, ...]]] = []

    class Recording(SecureRandom):
        def bernoulli(self, numerator: int, denominator: int, shape: tuple[int, ...]) -> Any:
            calls.append((numerator, denominator, shape))
            return super().bernoulli(numerator, denominator, shape)

    net = VAE(d=4, hidden=3, latent=2)
    X = torch.rand((30, 4))
    a = torch.zeros(30, dtype=torch.long)
    train(
        net,
        net.init(1, _normal(0)),
        X,
        a,
        torch.tensor([30.0]),
        _settings(steps=5, batch=7),
        sampler=_identity,
        generator=Recording.from_seed(1),
        normal=_normal(1),
        uniform=lambda shape: torch.rand(shape),
    )
    assert calls == [(7, 30, (30,))] * 5


def _data(n: int = 90, d: int = 6, k: int = 3) -> Any:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(k), n // k)
    X = np.clip(rng.normal(labels[:, None] / k, 0.1, size=(n, d)), 0, 1)
    return unit_dataset(X, labels, k)


def _release(params: dict[str, Any], data: Any, report: Any = None) -> Any:
    facts = facts_of(data)
    noise = noise_for("dpgm", params, facts, sigma=1.0)
    gen = SecureRandom.from_seed(3)
    from dpcore.mechanisms.noise import FastNoise

    return build(
        "dpgm",
        params,
        data,
        noise=noise,
        sampler=FastNoise(gen),
        generator=gen,
        device=torch.device("cpu"),
        report=report,
    )


@pytest.mark.parametrize("model", ["vae", "rbm"])
@pytest.mark.parametrize("clusters", [1, 2])
def test_release_rows_labels_weights_and_progress(
    model: str, clusters: int, tmp_path: Path
) -> None:
    data = _data()
    reports: list[tuple[float, float, str]] = []
    params = {
        "model": model,
        "clusters_per_class": clusters,
        "epochs": 1,
        "batch_size": 30,
        "hidden": 8,
        "n_samples": 50,
        "weights": True,
    }
    output = _release(params, data, lambda *r: reports.append(r))
    X, Y, _, _ = materialise(output)
    assert X.shape == (50, 6) and Y.shape == (50, 3)
    assert X.min() >= 0 and X.max() <= 1
    assert set(Y.sum(1).tolist()) == {1.0}  # one exact class per row
    assert reports[-1][2] == "sampling" and reports[-1][0] == reports[-1][1] == 1.0
    assert any(r[2].startswith("dp-sgd epoch") for r in reports)
    if clusters > 1:
        assert any(r[2].startswith("dp kernel k-means") for r in reports)
    (artifact,) = output.artifacts
    path = tmp_path / artifact.name
    artifact.write(path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["model"] == model
        classes = f.get_tensor("cluster_class")
        assert f.get_tensor(net_first := ("enc_w" if model == "vae" else "W")).shape[0] == len(
            classes
        ), net_first


def test_cancel_stops_training_between_steps() -> None:
    data = _data()
    seen: list[str] = []

    def report(done: float, total: float, phase: str) -> None:
        seen.append(phase)
        if phase.startswith("dp-sgd"):
            raise Cancelled("stop")

    with pytest.raises(Cancelled):
        _release({"epochs": 3, "batch_size": 30, "hidden": 4}, data, report)
    assert sum(p.startswith("dp-sgd") for p in seen) == 1


def test_admission_checks() -> None:
    spec = registry.get("dpgm")
    facts = facts_of(_data())
    with pytest.raises(InvalidParams, match="batch_size"):
        spec.check(spec.params.model_validate({"batch_size": 91}), facts)
    with pytest.raises(InvalidParams, match="DP-SGD steps"):
        spec.check(
            spec.params.model_validate({"batch_size": 1, "epochs": 1000}),
            facts_of(_data(), n=2000),
        )
    spec.check(spec.params.model_validate({"batch_size": 90}), facts)


def test_served_keys_derive_the_pipeline_the_job_runs() -> None:
    spec = registry.get("dpgm")
    facts = facts_of(_data())
    params = spec.params.model_validate(
        {"epochs": 2.5, "batch_size": 20, "clusters_per_class": 4, "kmeans_refine": 1}
    )
    event = spec.event_at(Target("tight", sigma=2.0), params, facts)
    assert isinstance(event, accounting.DPGMEvent)
    assert event.sgd_steps == math.ceil(2.5 * 90 / 20) == 12
    assert event.kmeans_iterations == 1 + 2 + 1
    assert event.sigma_norm == 4.0 * 2.0 and event.final_counts
    noise = event.noise()
    assert noise.sigma("gradients") == 2.0 and noise.calibrated == "gradients"
    # The k-means share: its μ² against the DP-SGD phase's central-limit μ².
    mu_sgd = accounting.sgd_mu(q=20 / 90, steps=12, step_distance=event.sgd_distance)
    assert event.kmeans_mu**2 == pytest.approx(0.1 / 0.9 * mu_sgd**2, rel=1e-9)
    # Charging the final sizes costs something.
    without = dataclasses.replace(event, final_counts=False)
    assert event.epsilon(1e-5) > without.epsilon(1e-5)


def test_calibration_with_served_keys_never_overshoots() -> None:
    spec = registry.get("dpgm")
    facts = facts_of(_data(n=600))
    params = spec.params.model_validate({"epochs": 2, "batch_size": 60})
    acc = spec.accountant("tight")
    keys = spec.accountant_keys(acc, params, facts)
    for target in (1.0, 10.0):
        event = acc.calibrate(target, 1e-5, keys)
        assert event.epsilon(1e-5) <= target
        sigma = event.noise().sigma("gradients")
        assert acc.at_sigma(sigma * (1 - 1e-4), keys).epsilon(1e-5) > target


def test_every_cluster_dropped_falls_back_to_one_network_per_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the k-means keeps no cluster (every noisy size under the threshold: released
    values), the release trains one network per class instead of failing after the charge."""
    from dpcore.mechanisms.dpgm import release as dpgm_release
    from dpcore.mechanisms.kmeans import Centres

    def no_clusters(*args: Any, **kwargs: Any) -> Centres:
        return Centres(torch.zeros((0, 1), dtype=torch.float64), torch.zeros(0, dtype=torch.long))

    monkeypatch.setattr(dpgm_release, "dp_kmeans", no_clusters)
    params = {"clusters_per_class": 2, "epochs": 1, "batch_size": 30, "hidden": 4, "n_samples": 30}
    output = _release(params, _data())
    X, Y, _, _ = materialise(output)
    assert X.shape == (30, 6) and set(Y.sum(1).tolist()) == {1.0}
    assert output.preprocessing["clusters"].startswith("3: one per class (every k-means")


@pytest.mark.parametrize("adam", [True, False])
def test_descent_is_torch_optims_arithmetic(adam: bool) -> None:
    """The hand-written Adam and SGD give torch.optim's updates bit for bit (Adam's fused)."""
    gen = torch.Generator().manual_seed(8)
    params = {"w": torch.randn((3, 5, 4), generator=gen), "b": torch.randn((3, 4), generator=gen)}
    mine = {k: v.clone() for k, v in params.items()}
    leaves = [v.clone().requires_grad_(True) for v in params.values()]
    reference = (
        torch.optim.Adam(leaves, lr=5e-3, fused=True)
        if adam
        else torch.optim.SGD(leaves, lr=5e-3, foreach=False)
    )
    descent = Descent(mine, 5e-3, adam=adam)
    for _ in range(5):
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
        for leaf, g in zip(leaves, grads.values(), strict=True):
            leaf.grad = g.clone()
        reference.step()
        descent.step(grads)
    for leaf, value in zip(leaves, mine.values(), strict=True):
        assert torch.equal(leaf.detach(), value)
