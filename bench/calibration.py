"""Calibration and accounting speed of every accountant.

Usage: python bench/calibration.py [--quick]

Prints one JSON line per case: the wall time of one ε evaluation at the calibrated noise (a new
event, nothing cached) and of a full calibration (smallest noise for a target ε).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from dpcore.accounting import registry

DPMIX = {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "d_x": 784, "d_y": 10}
CASES: list[tuple[str, str, float, float, dict[str, Any]]] = [
    # The README walkthrough: MNIST test split, ℓ = 64, T = 10000, ε = 10.
    ("dpmix", "tight", 10.0, 1e-5, DPMIX),
    # The accounting issue's speed target: n = T = 10^6.
    ("dpmix", "tight", 1.0, 1e-6, {"n": 10**6, "mixture_degree": 64, "n_samples": 10**6}),
    ("dpmix", "tight", 1.0, 1e-5, {**DPMIX, "assignment": "record"}),
    ("dpmix", "paper", 10.0, 1e-5, DPMIX),
    (
        "dpcda",
        "tight",
        10.0,
        1e-5,
        {
            "n": 10_000,
            "mixture_degree": 64,
            "n_samples": 10_000,
            "clip_norm": 1.0,
            "n_classes": 10,
            "min_class_size": 800,
        },
    ),
    ("sgdrm", "tight", 10.0, 1e-5, {"n": 60_000, "mixture_width": 128, "n_samples": 60_000}),
    ("sgdrm", "paper", 10.0, 1e-5, {"n": 60_000, "mixture_width": 128, "n_samples": 60_000}),
    ("clustmix", "paper", 1.0, 1e-5, {"cluster_size": 118, "n_classes": 10, "n_features": 784}),
    (
        "dpgm",
        "tight",
        2.0,
        1e-5,
        {
            "n": 60_000,
            "batch_size": 102,
            "sgd_steps": 11_780,
            "sigma_kmeans": 20.0,
            "sigma_norm": 4.0,
        },
    ),
    ("local_perturbation", "tight", 10.0, 1e-5, {"n": 10_000}),
    ("random_projection", "tight", 10.0, 1e-5, {"n": 10_000, "projection_dim": 50}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the first two cases")
    args = parser.parse_args()
    for mechanism, name, epsilon, delta, keys in CASES[:2] if args.quick else CASES:
        accountant = registry.get(mechanism, name)
        start = time.perf_counter()
        event = accountant.calibrate(epsilon, delta, keys)
        calibrate_s = time.perf_counter() - start
        noise = event.noise()
        sigma = next(iter(noise.values()))
        fresh = accountant.at_sigma(sigma * (1 + 1e-12), keys)  # not in any cache
        start = time.perf_counter()
        achieved = fresh.epsilon(delta)
        evaluate_s = time.perf_counter() - start
        line = {
            "mechanism": mechanism,
            "accountant": name,
            "target_epsilon": epsilon,
            "delta": delta,
            "keys": keys,
            "noise": noise,
            "achieved_epsilon": event.epsilon(delta),
            "one_evaluation_s": round(evaluate_s, 4),
            "calibration_s": round(calibrate_s, 3),
        }
        assert achieved <= epsilon * (1 + 1e-9)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
