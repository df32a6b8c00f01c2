"""Speed of the secure noise sampler against the fast one on an MNIST-sized release.

Usage: OMP_NUM_THREADS=1 python bench/noise.py [--mechanism NAME] [--rows 60000] [--repeat 3]

The release of the README walkthrough by default: the registry's first mechanism with its
sweet-spot parameters at ℓ = 64 on 10 000 rows of 784 features and 10 one-hot labels,
calibrated to ε = 10 at δ = 1e-5 with its tight accountant. Every noise scale the accountant
declares is drawn on random rows of its width, in chunks of 4096 rows as the worker does.
Both samplers draw from a ``SecureRandom`` (as in a release), in the same process and the same
loop, so their ratio is comparable across machines and loads. Prints one JSON line: the
lattice plans, the one-off table build (timed apart), and for each sampler the median time to
noise the whole release, per row and per entry, and their ratio secure/fast.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dpcore.mechanisms import registry, rounded_gaussian
from dpcore.mechanisms.noise import FastNoise, SecureNoise
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import PublicFacts

CHUNK, FEATURES, CLASSES = 4096, 784, 10


def _width(perturbs: tuple[str, ...]) -> int:
    width = FEATURES * ("features" in perturbs) + CLASSES * ("labels" in perturbs)
    return width or FEATURES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", default=registry.BUILTIN[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--ell", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = registry.get(args.mechanism)
    assert spec.bench.sweet_spot is not None, f"{spec.name} has no sweet-spot parameters"
    params = spec.params.model_validate(
        spec.bench.sweet_spot(args.ell, args.rows, args.rows // CLASSES)
    )
    facts = PublicFacts(n=args.rows, n_features=FEATURES, n_classes=CLASSES)
    accountant = spec.accountant("tight")
    keys = spec.accountant_keys(accountant, params, facts)
    noise = accountant.calibrate(args.epsilon, 1e-5, keys).noise()
    rows = {s.name: torch.rand((args.rows, _width(s.perturbs))) for s in noise.scales}

    rounded_gaussian._table.cache_clear()
    secure = SecureNoise(SecureRandom())
    start = time.perf_counter()
    for scale in noise.scales:
        plan = secure.plan(
            sigma=scale.sigma, sensitivity=scale.sensitivity, dim=rows[scale.name].shape[1]
        )
        rounded_gaussian.RoundedGaussian(plan.scale)
    build_s = time.perf_counter() - start

    timings: dict[str, list[float]] = {"secure": [], "fast": []}
    for _ in range(args.repeat):
        for name, sampler in (("secure", secure), ("fast", FastNoise(SecureRandom()))):
            start = time.perf_counter()
            for scale in noise.scales:
                values = rows[scale.name]
                for at in range(0, values.shape[0], CHUNK):
                    sampler(
                        values[at : at + CHUNK], sigma=scale.sigma, sensitivity=scale.sensitivity
                    )
            timings[name].append(time.perf_counter() - start)
    entries = sum(v.numel() for v in rows.values())
    secure_s = statistics.median(timings["secure"])
    fast_s = statistics.median(timings["fast"])
    print(
        json.dumps(
            {
                "mechanism": spec.name,
                "params": params.model_dump(),
                "rows": args.rows,
                "noised_entries": entries,
                "noise": noise.to_json(),
                "plans": secure.describe(),
                "table_entries": [
                    rounded_gaussian.table_size(p.scale) for p in secure.plans.values()
                ],
                "table_build_s": round(build_s, 3),
                "secure_s": round(secure_s, 3),
                "fast_s": round(fast_s, 3),
                "secure_us_per_row": round(1e6 * secure_s / args.rows, 2),
                "fast_us_per_row": round(1e6 * fast_s / args.rows, 2),
                "secure_ns_per_entry": round(1e9 * secure_s / entries, 1),
                "fast_ns_per_entry": round(1e9 * fast_s / entries, 1),
                "ratio_secure_to_fast": round(secure_s / fast_s, 2),
                "torch_threads": torch.get_num_threads(),
                "sigma_increase": max(p.slack for p in secure.plans.values()),
            }
        )
    )


if __name__ == "__main__":
    main()
