"""Calibration and accounting speed of the DPMix `tight` accountant.

Usage: python bench/calibration.py [--quick]

Prints one JSON line per case: the wall time of one ε evaluation and of a full calibration
(smallest σ for a target ε), with the resulting σ and ε.
"""

from __future__ import annotations

import argparse
import json
import time

from dpcore.accounting import dpmix

CASES = [
    # The README walkthrough: MNIST test split, ℓ = 64, T = 10000, ε = 10.
    {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "epsilon": 10.0, "delta": 1e-5},
    {"n": 10_000, "mixture_degree": 1, "n_samples": 10_000, "epsilon": 1.0, "delta": 1e-5},
    {"n": 60_000, "mixture_degree": 64, "n_samples": 60_000, "epsilon": 10.0, "delta": 1e-5},
    # The accounting issue's speed target.
    {"n": 10**6, "mixture_degree": 64, "n_samples": 10**6, "epsilon": 1.0, "delta": 1e-6},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the first case")
    args = parser.parse_args()
    for case in CASES[:1] if args.quick else CASES:
        start = time.perf_counter()
        event = dpmix.calibrate(**case)  # type: ignore[arg-type]
        calibrate_s = time.perf_counter() - start
        start = time.perf_counter()
        eps = event.epsilon(case["delta"])
        evaluate_s = time.perf_counter() - start
        print(
            json.dumps(
                {
                    **case,
                    "sigma_x": event.sigma_x,
                    "achieved_epsilon": eps,
                    "one_evaluation_s": round(evaluate_s, 4),
                    "calibration_s": round(calibrate_s, 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
