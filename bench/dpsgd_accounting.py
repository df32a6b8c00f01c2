"""σ calibrated by the accountants of the DP-SGD-style mechanisms (DPGM, ClustMix DP-KIP,
SGDRM) at reference settings: how the replace-one accounting moves the noise.

Usage: OMP_NUM_THREADS=1 python bench/dpsgd_accounting.py
Run it at two commits to compare accountings (docs/results/dpsgd_accounting.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcore.mechanisms import registry

DELTA = 1e-5
DPGM = {  # MNIST-10k with DPGMParams' defaults (L = 2000, 20 epochs, σ_C = 4σ_S, K = 1)
    "n": 10_000,
    "batch_size": None,
    "epochs": 20,
    "clusters_per_class": 1,
    "kmeans_refine": 2,
    "kmeans_share": 0.1,
    "norm_noise": 4.0,
    "rbf": "true",
}
DPKIP = {  # MNIST-10k, ClustMix dp with K = 8 and DP-KIP (docs/results/clustmix_options.md)
    "n": 10_000,
    "clusters_per_class": 8,
    "kmeans_refine": 1,
    "kmeans_share": 0.5,
    "count_share": 0.1,
    "dpkip_batch": 256,
    "dpkip_share": 0.2,
}
SGDRM = [
    {"n": 60_000, "mixture_width": 128, "n_samples": 60_000},
    {"n": 10_000, "mixture_width": 64, "n_samples": 10_000},
    {"n": 10_000, "mixture_width": 8, "n_samples": 10_000},
]


def rows() -> list[tuple[str, float, float, float]]:
    """(setting, ε, σ, seconds) for every reference setting."""
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("dpgm", "MNIST-10k defaults", DPGM, "sigma_sgd"),
        ("clustmix", "DP-KIP 50 steps", {**DPKIP, "dpkip_steps": 50}, "sigma"),
        ("clustmix", "DP-KIP 200 steps", {**DPKIP, "dpkip_steps": 200}, "sigma"),
    ]
    for keys in SGDRM:
        name = f"SGDRM n = T = {keys['n']}, ℓ = {keys['mixture_width']}"
        cases.append(("sgdrm", name, keys, "sigma"))
    out = []
    for mechanism, name, keys, field in cases:
        accountant = registry.accountant(mechanism, "tight")
        for epsilon in (1.0, 10.0):
            start = time.perf_counter()
            event = accountant.calibrate(epsilon, DELTA, keys)
            assert event.epsilon(DELTA) <= epsilon
            out.append((name, epsilon, float(getattr(event, field)), time.perf_counter() - start))
    return out


def main() -> None:
    print("| setting | ε | σ | seconds |")
    print("|---|---|---|---|")
    for name, epsilon, sigma, seconds in rows():
        print(f"| {name} | {epsilon:g} | {sigma:.4f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
