"""Four probes of what a generator in ClustMix's coordinates could reach on MNIST-10k
(docs/results/moment_model.md, "Beyond one Gaussian per class"), scored as bench/moment_model.py
scores (x/255, 5 000 held-out images). Every probe works in the release's coordinates: unit rows
(clip C = 7) projected on the first ``--k`` 2-D DCT coefficients, decoded linearly, clipped to
[0, 1].

- ``projection``: the private rows themselves, projected and decoded: a perfect generator of
  those coordinates (non-private). The ceiling of any model in them.
- ``denoiser``: a class-conditional MLP denoiser trained (non-private, Adam) on the standardised
  coefficients over noise levels 0.01–80 (EDM preconditioning and weighting), then used to
  refine draws of each class's exact Gaussian (SDEdit: noise of std ``--start`` added, then
  deterministic steps down to 0.01) or, with ``--start`` ≥ 50, to sample from noise alone.
- ``pooled``: a DP mixture per class at ``--epsilon`` (δ = 1e-5; numpy Gaussian noise, not the
  secure sampler): the class's noisy count, sum and second moments (shares 5/45/50 of μ²,
  sensitivities √2, 2, √2 for unit rows), then ``--iters`` DP k-means steps with ``--clusters``
  centres per class (``--kshare`` of μ²; sums and counts 90/10), started from draws of the
  class's noisy Gaussian. Every component gets the class's covariance pooled within the
  components, Σ_w = (S₂ − Σ_j s_j s_jᵀ / n_j) / N: post-processing of released sums, so
  components cost their means only. Shrunk toward its diagonal by the known-noise weight.
- ``guidance``: ClustMix's default release at ``--epsilon`` (``bench.clustmix_gaussian``,
  FastNoise) whose rows are moved by ``--nsteps`` steps of L2 length ``--step`` down the
  gradient of a CNN's cross-entropy for each row's own class, then clipped to [0, 1]: classifier
  guidance. The CNN is trained without privacy on the private rows (the best possible guide);
  not a mechanism.

    DPRELEASE_SHARED=/work/shared python -m bench.generator_probes projection --k 128
    DPRELEASE_SHARED=/work/shared python -m bench.generator_probes denoiser --start 1
    DPRELEASE_SHARED=/work/shared python -m bench.generator_probes pooled --clusters 20
    DPRELEASE_SHARED=/work/shared python -m bench.generator_probes guidance --nsteps 5 --step 1

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.gaussian_ceiling import CLIP, coordinates
from bench.mnist import DELTA, load_test
from bench.moment_model import score
from dpcore.accounting import gdp


def _decode(Z: np.ndarray, B: np.ndarray) -> np.ndarray:
    return np.clip(Z @ B.T * CLIP, 0.0, 1.0)


class Denoiser(nn.Module):
    """D(z, σ, y) ≈ E[z₀ | z₀ + σε = z, y], with data std 1 (EDM's c_skip, c_out, c_in)."""

    def __init__(self, k: int, width: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(k + 27, width), nn.SiLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.SiLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, k))

    def forward(self, z: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = sigma.view(-1, 1)
        log_s = torch.log(s)
        freq = torch.arange(1, 9, dtype=z.dtype).view(1, -1)
        onehot = nn.functional.one_hot(y, 10).to(z.dtype)
        inputs = [z / torch.sqrt(1 + s**2), log_s, onehot, torch.sin(log_s * freq)]
        out = self.net(torch.cat([*inputs, torch.cos(log_s * freq)], 1))
        return z / (1 + s**2) + out * s / torch.sqrt(1 + s**2)


def _noise_levels(n: int, low: float = 0.01, high: float = 80.0) -> torch.Tensor:
    return torch.exp(torch.empty(n).uniform_(math.log(low), math.log(high)))


def denoiser(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    _, labels, Zr, B = coordinates(args.k)
    mean, std = Zr.mean(0), Zr.std(0)
    Z = torch.tensor((Zr - mean) / std, dtype=torch.float32)
    y = torch.tensor(labels)
    net = Denoiser(args.k, args.width, args.depth)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(args.steps):
        idx = torch.randint(0, len(Z), (256,))
        s = _noise_levels(256)
        noisy = Z[idx] + s.view(-1, 1) * torch.randn_like(Z[idx])
        weight = (1 + s**2) / s**2
        loss = (weight * ((net(noisy, s, y[idx]) - Z[idx]) ** 2).sum(1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    rng = np.random.default_rng(args.seed)
    Zs = Z.numpy().astype(np.float64)
    draws = [
        rng.multivariate_normal(
            Zs[labels == c].mean(0), np.cov(Zs[labels == c].T), (labels == c).sum()
        )
        for c in range(10)
    ]
    ys = np.concatenate([np.full((labels == c).sum(), c) for c in range(10)])
    start = torch.tensor(np.vstack(draws), dtype=torch.float32)
    from_noise = args.start >= 50
    levels = np.geomspace(args.start, 0.01, 2 * args.nsteps if from_noise else args.nsteps)
    gen = torch.Generator().manual_seed(args.seed)
    z = (torch.zeros_like(start) if from_noise else start) + levels[0] * torch.randn(
        start.shape, generator=gen
    )
    with torch.no_grad():
        for i, s in enumerate(levels):
            d = net(z, torch.full((len(z),), float(s)), torch.tensor(ys))
            z = d + (levels[i + 1] / s) * (z - d) if i + 1 < len(levels) else d
    return _decode(z.numpy().astype(np.float64) * std + mean, B), ys


def _mu2(epsilon: float) -> float:
    low, high = 1e-3, 50.0
    for _ in range(80):  # bisection: the largest μ whose ε stays at or under the target
        mid = (low + high) / 2
        low, high = (mid, high) if gdp.epsilon_of(mid, DELTA) <= epsilon else (low, mid)
    return low**2


def _symmetric_noise(rng: np.random.Generator, k: int, sigma: float) -> np.ndarray:
    E = np.triu(rng.normal(0.0, sigma, (k, k)))
    return E + np.triu(E, 1).T


def pooled(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    _, labels, Z, B = coordinates(args.k)
    rng = np.random.default_rng(args.seed)
    k = Z.shape[1]
    mu2 = _mu2(args.epsilon)
    kmeans_share = args.kshare if args.clusters > 1 else 0.0
    rest = mu2 * (1 - kmeans_share)
    sd_count, sd_sum, sd_second = (
        math.sqrt(2 / (0.05 * rest)),
        2 / math.sqrt(0.45 * rest),
        math.sqrt(2 / (0.5 * rest)),
    )
    if kmeans_share:
        step = mu2 * kmeans_share / args.iters
        sd_ksum, sd_kcount = 2 / math.sqrt(0.9 * step), math.sqrt(2 / (0.1 * step))
    rows, ys = [], []
    for c in range(10):
        Zc = Z[labels == c]
        N = len(Zc) + rng.normal(0.0, sd_count)
        S1 = Zc.sum(0) + rng.normal(0.0, sd_sum, k)
        S2 = Zc.T @ Zc + _symmetric_noise(rng, k, sd_second)
        means, weights = (S1 / N)[None], np.array([N])
        if kmeans_share:
            cov = S2 / N - np.outer(S1 / N, S1 / N)
            w, V = np.linalg.eigh(cov)
            centres = rng.multivariate_normal(
                S1 / N, (V * np.maximum(w, 1e-6)) @ V.T, args.clusters
            )
            for _ in range(args.iters):
                member = ((Zc[:, None, :] - centres[None]) ** 2).sum(2).argmin(1)
                sums = np.stack([Zc[member == j].sum(0) for j in range(args.clusters)])
                sums += rng.normal(0.0, sd_ksum, sums.shape)
                counts = np.bincount(member, minlength=args.clusters) + rng.normal(
                    0.0, sd_kcount, args.clusters
                )
                keep = counts > 3 * sd_kcount
                centres = np.where(keep[:, None], sums / np.maximum(counts, 1.0)[:, None], centres)
            means, weights = centres[keep], counts[keep]
        within = (S2 - (means * weights[:, None]).T @ means) / N
        off = within - np.diag(np.diag(within))
        lam = min(1.0, (sd_second / N) ** 2 * k * (k - 1) / max(float((off**2).sum()), 1e-12))
        cov = (1 - lam) * within + lam * np.diag(np.maximum(np.diag(within), 1e-6))
        w, V = np.linalg.eigh(cov)
        count = int((labels == c).sum())
        pick = rng.choice(len(means), size=count, p=weights / weights.sum())
        spread = rng.multivariate_normal(np.zeros(k), (V * np.maximum(w, 1e-6)) @ V.T, count)
        rows.append(means[pick] + spread)
        ys.append(np.full(count, c))
    return _decode(np.vstack(rows), B), np.concatenate(ys)


def guidance(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, float]:
    """The guided release rows (x/255), their classes, and the share of them the guide puts
    in their own class after guidance."""
    from bench.clustmix_gaussian import release_rows
    from bench.dpsgd_cnn import cnn
    from bench.gaussian_ceiling import private_rows

    X, y = release_rows(args.epsilon, args.seed)
    R, labels = private_rows()
    guide = nn.Sequential(nn.Unflatten(1, (1, 28, 28)), *cnn())  # the DP-SGD reference's CNN
    optimiser = torch.optim.SGD(guide.parameters(), lr=0.1, momentum=0.9)
    xs, ys = torch.tensor(R, dtype=torch.float32), torch.as_tensor(labels)
    for _ in range(8):
        order = torch.randperm(len(xs))
        for at in range(0, len(xs), 128):
            batch = order[at : at + 128]
            optimiser.zero_grad()
            nn.functional.cross_entropy(guide(xs[batch]), ys[batch]).backward()
            optimiser.step()
    guide.requires_grad_(False)
    x, target = torch.tensor(X, dtype=torch.float32), torch.as_tensor(y)
    for _ in range(args.nsteps):
        x.requires_grad_(True)
        loss = nn.functional.cross_entropy(guide(x), target, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            x = (x - args.step * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(0, 1)
    with torch.no_grad():
        agree = float((guide(x).argmax(1) == target).float().mean())
    return x.numpy().astype(np.float64), np.asarray(y), agree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("probe", choices=["projection", "denoiser", "pooled", "guidance"])
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--start", type=float, default=1.0)
    parser.add_argument("--nsteps", type=int, default=20)
    parser.add_argument("--step", type=float, default=1.0)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--kshare", type=float, default=0.3)
    parser.add_argument("--families", default="sklearn_mlp,knn,rf")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    result: dict[str, Any] = {key: v for key, v in vars(args).items() if key != "families"}
    if args.probe == "projection":
        _, y, Z, B = coordinates(args.k)
        X = _decode(Z, B)
    elif args.probe == "guidance":
        X, y, result["guide_agrees"] = guidance(args)
    else:
        X, y = denoiser(args) if args.probe == "denoiser" else pooled(args)
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    result.update(score(X, y, test, test_labels, args.families.split(","), args.seed))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
