"""Calibration and accounting speed of every accountant.

Usage: python bench/calibration.py [--quick]

Prints one JSON line per case: the wall time of one ε evaluation at the calibrated noise (a new
event, nothing cached) and of a full calibration (smallest noise for a target ε).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

from bench import hints
from dpcore.mechanisms import registry


def cases() -> list[tuple[str, str, float, float, dict[str, Any]]]:
    """Every mechanism's benchmark cases (its ``bench.hints`` calibration cases), registry order."""
    return [
        (spec.name, case.accountant, case.epsilon, case.delta, dict(case.keys))
        for spec in registry.specs()
        for case in hints.of(spec.name).calibration
    ]


def measure(quick: bool = False) -> Iterator[dict[str, Any]]:
    """One dict per case (every case, or the first two with ``quick``)."""
    every = cases()
    for mechanism, name, epsilon, delta, keys in every[:2] if quick else every:
        accountant = registry.accountant(mechanism, name)
        start = time.perf_counter()
        event = accountant.calibrate(epsilon, delta, keys)
        calibrate_s = time.perf_counter() - start
        noise = event.noise()
        sigma = noise.sigma_x
        fresh = accountant.at_sigma(sigma * (1 + 1e-12), keys)  # not in any cache
        start = time.perf_counter()
        achieved = fresh.epsilon(delta)
        evaluate_s = time.perf_counter() - start
        assert achieved <= epsilon * (1 + 1e-9)
        yield {
            "mechanism": mechanism,
            "accountant": name,
            "target_epsilon": epsilon,
            "delta": delta,
            "keys": keys,
            "noise": {s.name: s.sigma for s in noise.scales},
            "achieved_epsilon": event.epsilon(delta),
            # Three significant digits, not a fixed number of decimals: a closed-form
            # accountant answers in microseconds, which rounded to 0.0 (and read as unmeasured).
            "one_evaluation_s": _seconds(evaluate_s),
            "calibration_s": _seconds(calibrate_s),
        }


def _seconds(value: float) -> float:
    return float(f"{value:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the first two cases")
    args = parser.parse_args()
    for line in measure(args.quick):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
