"""Prototype of ClustMix's ``values: matched`` (now served; ``dpcore.mechanisms.values``):
model gaussian's MNIST rows (``values: model``) with their pixel values mapped onto a DP
estimate of the private pixel-value distribution, scored as an analyst would.

The Gaussian samples are hazy where real digits are sharp (about 37 % of their pixels at 0,
81 % of MNIST's). One more statistic fixes the values' distribution: the histogram of every
pixel value of every record, each record weighing 1 in total (its pixel-value histogram
divided by d), plus N(0, σ_m²) per bin. Replace-one moves one record's probability vector p to
p′, ‖p − p′‖₂² = ‖p‖² + ‖p′‖² − 2p·p′ ≤ 2 (‖p‖₂ ≤ ‖p‖₁ = 1, p·p′ ≥ 0): sensitivity √2,
attained by two records whose pixels all sit in different bins. The release is calibrated at
the μ left after the histogram's share: μ_r² + μ_m² = μ², μ_m² = share·μ² (GDP composition),
so the composed ε never passes the target (the release's calibration never overshoots its own).

Post-processing only: each sampled value v is mapped through F̂⁻¹(F_s(v)), F_s the empirical
distribution of all sampled values, F̂ the noisy histogram's (negative bins clamped to 0);
``--blend`` w releases (1 − w)·v + w·F̂⁻¹(F_s(v)); F̂ is the running sum of the noisy bins over n
(public), made monotone by isotonic regression. The same pooled statistic only makes sense
where every feature shares one range and meaning (image pixels); a table would need one
histogram per column (sensitivity √(2d)).

    DPRELEASE_SHARED=/work/shared python -m bench.marginal_map --epsilon 1 --blend 0,0.3,1 \
        --families rf,hgb,knn,logistic,sklearn_mlp

Prints one JSON line per blend (figures in docs/results/moment_model.md, "Pixel values").
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.mnist import DELTA, SHARED, load_private, load_test
from bench.moment_model import score
from dpcore.accounting import gdp
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dprelease_cli.idx import read_idx

BINS = 256  # one per MNIST grey level
SENSITIVITY = math.sqrt(2.0)


def noisy_value_histogram(
    X01: np.ndarray, mu: float, generator: np.random.Generator
) -> tuple[np.ndarray, float]:
    """Σ over records of each record's pixel-value histogram / d, + N(0, σ²) per bin, σ = √2/μ
    (μ-GDP). ``X01`` (n, d) in [0, 1]."""
    d = X01.shape[1]
    bins = np.rint(X01 * (BINS - 1)).astype(np.int64)
    hist = np.bincount(bins.ravel(), minlength=BINS).astype(np.float64) / d
    sigma = SENSITIVITY / mu
    return hist + generator.normal(0.0, sigma, BINS), sigma


def value_map(values: np.ndarray, hist: np.ndarray, n: int) -> np.ndarray:
    """Each value v ∈ [0, 1] → F̂⁻¹(F_s(v)): its rank among ``values``, then that quantile of the
    histogram's distribution, a grey level b/255 (the data's own values). Ties share their mid
    rank. F̂ is the noisy histogram's running sum over n (public: each record weighs 1), made
    non-decreasing by isotonic regression and clipped to [0, 1]: summing first averages the
    per-bin noise that clamping each bin at 0 would turn into mass."""
    from sklearn.isotonic import isotonic_regression

    flat = values.ravel()
    order = np.argsort(flat, kind="stable")
    ranks = np.empty(len(flat))
    ranks[order] = (np.arange(len(flat)) + 0.5) / len(flat)
    # Equal values get one rank (their mean), so that a tie is not split across targets.
    _, inverse = np.unique(flat, return_inverse=True)
    ranks = (np.bincount(inverse, weights=ranks) / np.bincount(inverse))[inverse]
    cdf = np.clip(isotonic_regression(np.cumsum(hist) / n), 0.0, 1.0)
    cdf[-1] = 1.0
    level = np.minimum(np.searchsorted(cdf, ranks), BINS - 1)
    return (level / (BINS - 1)).reshape(values.shape)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--share", type=float, default=0.05, help="the histogram's share of μ²")
    parser.add_argument("--blend", default="0,0.3,1")
    parser.add_argument("--families", default="logistic,knn,rf")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    shared = Path(os.environ.get("DPRELEASE_SHARED", SHARED))
    data = load_private(shared)
    spec = registry.get("clustmix")
    facts = facts_of(data)
    # The model's own values: this script adds the histogram itself.
    resolved = spec.resolve(spec.request_params.model_validate({"values": "model"}), facts)
    params = resolved.model_dump()
    mu = gdp.mu_for_epsilon(args.epsilon, DELTA)
    mu_hist = math.sqrt(args.share) * mu
    release_epsilon = gdp.epsilon_of(math.sqrt(1.0 - args.share) * mu, DELTA)
    tight = spec.accountant("tight")
    event = tight.calibrate(release_epsilon, DELTA, spec.accountant_keys(tight, resolved, facts))
    assert isinstance(event, ClustMixDPEvent)
    noise = noise_for("clustmix", params, facts, sigma=event.sigma)
    generator = SecureRandom.from_seed(args.seed)
    out = build(
        "clustmix",
        params,
        data,
        noise=noise,
        sampler=FastNoise(generator),
        generator=generator,
        device=torch.device("cpu"),
    )
    chunks = list(out.chunks)
    X = torch.cat([x for x, _ in chunks]).double().numpy()
    y = torch.cat([labels for _, labels in chunks]).numpy().argmax(axis=1)
    assert out.transform is not None
    synthetic = out.transform.to_raw(X) / 255.0
    private = read_idx(shared / "datasets/mnist-t10k/t10k-images-idx3-ubyte.gz")
    private01 = private.reshape(len(private), -1) / 255.0
    hist, sigma = noisy_value_histogram(private01, mu_hist, np.random.default_rng(args.seed))
    mapped = value_map(synthetic, hist, len(private01))
    total = math.sqrt(event.mu**2 + mu_hist**2)
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    for w in [float(v) for v in args.blend.split(",")]:
        rows = (1.0 - w) * synthetic + w * mapped
        result: dict[str, Any] = {
            "epsilon": args.epsilon,
            "charged": round(gdp.epsilon_of(total, DELTA), 4),
            "share": args.share,
            "sigma_hist": round(sigma, 2),
            "blend": w,
            "seed": args.seed,
            "at_zero": round(float((rows == 0).mean()), 3),
            "in_range": bool(rows.min() >= 0 and rows.max() <= 1 + 1e-6),
            "distinct": len(np.unique(rows.round(6), axis=0)),
        }
        scores = score(rows, y, test, test_labels, args.families.split(","), args.seed)
        result.update({name: round(value, 3) for name, value in scores.items()})
        result["worst"] = round(min(scores.values()), 3)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
