"""Probes of ClustMix's fit and decoding that were measured and not kept: each replaces one
step of the served gaussian release (``moments.decode`` or ``moments.fit``) for the length of
one ``bench.clustmix_gaussian`` run, whose options follow the probe's (figures in
docs/results/moment_model.md, "Ridge, decoding and the fit").

    DPRELEASE_SHARED=/work/shared python -m bench.fit_probes pocs --iterations 30 \
        --epsilon 1 --seed 11 --families ridge,logistic,knn,rf,hgb,sklearn_mlp

(every option but the probe's own goes to ``bench.clustmix_gaussian``).

``pocs``: after C·Bz is clipped to [0, 1], alternate between restoring the sampled basis
coefficients and clipping (projections onto the two convex sets), so the released row keeps the
model's coefficients and lies in the bounds. ``means``: each cluster's mean
shrunk toward the count-weighted mean of all, per coordinate, by τ²/(τ² + v), v = (σ_sums/N)²
the known noise variance and τ² the spread of the clusters' means beyond it. ``spikes``: each
class's covariance rebuilt from the eigenvalues of S2/N − m mᵀ above the noise edge (debiased
as spikes on symmetric noise of entry variance (σ₂/N)²/2) plus the diagonal target on the rest.
``residual``: every decoded row gains isotropic Gaussian detail outside the basis with the
private rows' exact mean energy there (``--fraction`` times it); ``shaped``: the same with each
left-out DCT function's own exact variance, or (``--power p``) variances ∝ (u + v)^(−p) scaled
to the exact total (figures in "Detail outside the basis"; the served option ``detail:
outside`` estimates the energy under DP).

Two measurements without a release step replaced (one JSON line each):

    DPRELEASE_SHARED=/work/shared python -m bench.fit_probes projection
    DPRELEASE_SHARED=/work/shared python -m bench.fit_probes ridge --epsilon 1

``projection``: the private images projected on the release's coordinates (k = 128 DCT, C = 7),
unclipped, clipped to [0, 1], and clipped with the coefficients restored (``pocs``), scored by
ridge, logistic, kNN and random forest. ``ridge``: ridge on the label matrix at λ = 1, 10, 100,
1000, trained on the default release (seed 11) and on the private images.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import clustmix_gaussian
from dpcore.mechanisms import moments
from dpcore.mechanisms.basis import Basis

_decode = moments.decode
_fit = moments.fit


def pocs(iterations: int) -> None:
    def decode(
        Z: torch.Tensor, basis: Basis, clip: float, contrast: float = 1.0, detail: Any = None
    ) -> torch.Tensor:
        x = _decode(Z, basis, clip, contrast, detail)
        target = Z * clip
        for _ in range(iterations):
            x = (x + basis.lift(target - basis.project(x), torch.float64)).clamp(0.0, 1.0)
        return x

    moments.decode = decode


def _private_unit_rows(clip: float) -> torch.Tensor:
    """The private images (x/255) as the release's unit rows (no noise: probes of ceilings)."""
    data = clustmix_gaussian.load_private(
        Path(os.environ.get("DPRELEASE_SHARED", clustmix_gaussian.SHARED))
    )
    return moments.unit_rows(torch.as_tensor(data.X.reshape(len(data.X), -1) / 255.0), clip)


def residual_shaped(fraction: float, power: float | None = None) -> None:
    """As ``residual``, but the detail's variance per DCT function beyond the basis follows the
    private unit rows' mean square coefficient on that function (measured without noise: the
    ceiling of a DP estimate of those d − k numbers)."""
    from dpcore.mechanisms.basis import dct_basis

    state: dict[str, torch.Tensor] = {}

    def decode(
        Z: torch.Tensor, basis: Basis, clip: float, contrast: float = 1.0, detail: Any = None
    ) -> torch.Tensor:
        k = Z.shape[1]
        if "tail" not in state:
            U = _private_unit_rows(clip)
            full = torch.as_tensor(np.array(dct_basis((28, 28), U.shape[1])))
            tail = full[:, k:]
            state["tail"] = tail
            if power is None:
                state["std"] = (fraction * (U @ tail).pow(2).mean(0)).sqrt()
            else:
                # A public spectrum: variance ∝ (u + v)^(−power) over the left-out DCT functions
                # (zig-zag order), scaled to the measured total energy outside the basis.
                order = sorted(
                    ((u, v) for u in range(28) for v in range(28)), key=lambda t: (sum(t), t[0])
                )
                freq = torch.tensor([float(u + v) for u, v in order[k:]], dtype=torch.float64)
                shape = freq.pow(-power)
                energy = float((U @ tail).pow(2).sum(1).mean())
                state["std"] = (fraction * energy * shape / shape.sum()).sqrt()

        def shaped(x: torch.Tensor) -> torch.Tensor:
            eps = torch.randn((x.shape[0], state["tail"].shape[1]), dtype=torch.float64)
            return x + (eps * state["std"]) @ state["tail"].T

        return _decode(Z, basis, clip, contrast, detail=shaped)

    moments.decode = decode


def residual(fraction: float) -> None:
    """Rows given the served option's detail (``dpcore.mechanisms.detail.Detail``: isotropic
    outside the basis), its energy ``fraction`` times the private unit rows' exact mean energy
    there (measured without noise: a probe of the ceiling; the option estimates that one scalar
    under DP)."""
    from dpcore.mechanisms.detail import Detail, total
    from dpcore.mechanisms.secure_random import SecureRandom

    state: dict[str, Detail] = {}
    generator = SecureRandom()

    def decode(
        Z: torch.Tensor, basis: Basis, clip: float, contrast: float = 1.0, detail: Any = None
    ) -> torch.Tensor:
        if "detail" not in state:
            U = _private_unit_rows(clip)
            energy = float(total(U, basis.project(U))[0, 0])
            state["detail"] = Detail(fraction * energy, U.shape[0], basis)
            print(json.dumps({"residual_energy": energy / U.shape[0]}), file=sys.stderr)
        outside = state["detail"]
        return _decode(Z, basis, clip, contrast, detail=lambda x: outside(x, generator))

    moments.decode = decode


def means() -> None:
    def fit(stats: Any, scales: Any, options: Any) -> moments.Model:
        model = _fit(stats, scales, options)
        if model.means.shape[0] < 3:
            return model
        N = model.weights.clamp_min(1.0)
        centre = (N[:, None] * model.means).sum(0) / N.sum()
        D = model.means - centre
        v = (scales.sums / N) ** 2
        tau2 = ((D**2).mean(0) - v.mean()).clamp_min(0.0)
        model.means = centre + tau2[None, :] / (tau2[None, :] + v[:, None]) * D
        return model

    moments.fit = fit


def spikes() -> None:
    def fit(stats: Any, scales: Any, options: Any) -> moments.Model:
        model = _fit(stats, scales, options)
        h = stats.second_dim
        keep = stats.counts >= options.min_count
        counts = stats.counts[keep]
        mh = (stats.sums[keep] / counts[:, None])[:, :h]
        head = h * (h + 1) // 2
        raw = moments.untriangle(stats.second[keep, :head], h) / counts[:, None, None]
        raw = raw - mh[:, :, None] * mh[:, None, :]
        factors, kept = [], []
        for c in range(raw.shape[0]):
            S = (raw[c] + raw[c].T) / 2
            lam = model.shrink_weights[c]
            shrunk = model.factors[c] @ model.factors[c].T
            # The diagonal target the served fit used: shrunk = (1 − λ)S + λT.
            T = torch.diag(torch.diagonal((shrunk - (1 - lam) * S) / lam if lam > 0 else S))
            theta2 = h * (scales.second / float(counts[c])) ** 2 / 2
            values, vectors = torch.linalg.eigh(S)
            big = values > 2 * math.sqrt(theta2)
            ell = (values[big] + torch.sqrt(values[big] ** 2 - 4 * theta2)) / 2
            V = vectors[:, big]
            rest = torch.eye(h, dtype=S.dtype) - V @ V.T
            sigma = V @ torch.diag(ell) @ V.T + rest @ T @ rest
            w, U = torch.linalg.eigh((sigma + sigma.T) / 2)
            factors.append(U * (w.clamp_min(options.floor) * options.temperature).sqrt()[None, :])
            kept.append(int(big.sum()))
        print(f"eigenvalues kept per class: {kept}", file=sys.stderr)
        model.factors = torch.stack(factors)
        return model

    moments.fit = fit


def projection() -> dict[str, Any]:
    from bench.gaussian_ceiling import CLIP, coordinates
    from bench.mnist import load_test
    from bench.moment_model import score

    _, labels, Z, B = coordinates()
    test, test_labels = load_test()
    test = test.reshape(len(test), -1) / 255.0
    P = Z @ B.T * CLIP
    x = np.clip(P, 0.0, 1.0)
    for _ in range(30):
        x = np.clip(x + (Z * CLIP - x @ B) @ B.T, 0.0, 1.0)
    families = ["ridge", "logistic", "knn", "rf"]
    rows = {"unclipped": P, "clipped": np.clip(P, 0.0, 1.0), "clipped, pocs 30": x}
    return {name: score(X, labels, test, test_labels, families, 11) for name, X in rows.items()}


def ridge(epsilon: float) -> dict[str, Any]:
    from bench.gaussian_ceiling import private_rows
    from bench.mnist import load_test

    released = clustmix_gaussian.release(epsilon, {}, "array", 11)
    private, labels = private_rows()
    test, test_labels = load_test()
    test = np.hstack([test.reshape(len(test), -1) / 255.0, np.ones((len(test), 1))])

    def accuracy(X: np.ndarray, y: np.ndarray, lam: float) -> float:
        A = np.hstack([X, np.ones((len(X), 1))])
        W = np.linalg.solve(A.T @ A + lam * np.eye(A.shape[1]), A.T @ np.eye(10)[y])
        return round(float(((test @ W).argmax(1) == test_labels).mean()), 4)

    return {
        str(lam): {
            "release": accuracy(released.raw / 255.0, released.y, lam),
            "private": accuracy(private, labels, lam),
        }
        for lam in (1.0, 10.0, 100.0, 1000.0)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "probe",
        choices=["pocs", "means", "spikes", "residual", "shaped", "projection", "ridge"],
    )
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--power", type=float, default=None)
    args, rest = parser.parse_known_args()
    if args.probe in ("projection", "ridge"):
        torch.set_num_threads(2)
        epsilon = float(rest[rest.index("--epsilon") + 1]) if "--epsilon" in rest else 1.0
        print(json.dumps(projection() if args.probe == "projection" else ridge(epsilon)))
        return
    {
        "pocs": lambda: pocs(args.iterations),
        "residual": lambda: residual(args.fraction),
        "shaped": lambda: residual_shaped(args.fraction, args.power),
        "means": means,
        "spikes": spikes,
    }[args.probe]()
    sys.argv = [sys.argv[0], *[a for a in rest if a != "--"]]
    clustmix_gaussian.main()


if __name__ == "__main__":
    main()
