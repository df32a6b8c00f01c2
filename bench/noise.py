"""Speed of the secure noise sampler against the fast one on an MNIST-sized DPMix release.

Usage: python bench/noise.py [--rows 10000] [--repeat 3]

The release of the README walkthrough: 10 000 mixtures of 784 features and 10 one-hot labels,
ℓ = 64, σ_x = σ_y = 0.02634 (ε = 10 at δ = 1e-5). Prints one JSON line: the lattice plans,
the one-off table build, and the median time to noise the whole release with each sampler,
in chunks of 4096 rows as the worker does.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from dpcore.accounting.dpmix import FEATURE_SENSITIVITY, LABEL_SENSITIVITY
from dpcore.mechanisms import rounded_gaussian
from dpcore.mechanisms.noise import FastNoise, SecureNoise

ELL, SIGMA, CHUNK = 64, 0.02634, 4096


def _noise_all(noise: object, x: torch.Tensor, y: torch.Tensor) -> None:
    for start in range(0, x.shape[0], CHUNK):
        noise(x[start : start + CHUNK], sigma=SIGMA, sensitivity=FEATURE_SENSITIVITY / ELL)  # type: ignore[operator]
        noise(y[start : start + CHUNK], sigma=SIGMA, sensitivity=LABEL_SENSITIVITY / ELL)  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    x = torch.rand((args.rows, 784), dtype=torch.float32)
    y = torch.rand((args.rows, 10), dtype=torch.float32)

    rounded_gaussian._table.cache_clear()
    secure = SecureNoise()
    start = time.perf_counter()
    for sens, dim in ((FEATURE_SENSITIVITY / ELL, 784), (LABEL_SENSITIVITY / ELL, 10)):
        plan = secure.plan(sigma=SIGMA, sensitivity=sens, dim=dim)
        rounded_gaussian.RoundedGaussian(plan.scale)
    build_s = time.perf_counter() - start

    timings: dict[str, list[float]] = {"secure": [], "fast": []}
    for _ in range(args.repeat):
        for name, noise in (("secure", secure), ("fast", FastNoise(torch.Generator()))):
            start = time.perf_counter()
            _noise_all(noise, x, y)
            timings[name].append(time.perf_counter() - start)
    entries = args.rows * (784 + 10)
    print(
        json.dumps(
            {
                "rows": args.rows,
                "noised_entries": entries,
                "plans": secure.describe(),
                "table_entries": [
                    rounded_gaussian.table_size(p.scale) for p in secure.plans.values()
                ],
                "table_build_s": round(build_s, 3),
                "secure_s": round(statistics.median(timings["secure"]), 3),
                "fast_s": round(statistics.median(timings["fast"]), 3),
                "secure_ns_per_entry": round(
                    1e9 * statistics.median(timings["secure"]) / entries, 1
                ),
                "torch_threads": torch.get_num_threads(),
                "sigma_increase": max(p.slack for p in secure.plans.values()),
                "sqrt2_over_ell": math.sqrt(2) / ELL,
            }
        )
    )


if __name__ == "__main__":
    main()
