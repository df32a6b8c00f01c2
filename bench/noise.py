"""Speed of the secure noise sampler against the fast one on an MNIST-sized release.

Usage: OMP_NUM_THREADS=1 python bench/noise.py [--mechanism NAME] [--rows 60000] [--repeat 3]
    [--device cuda]
       OMP_NUM_THREADS=1 python bench/noise.py --guide 8807 62000 [--bits 18 20] [--repeat 15]

The release of the guide's "MNIST at full size" by default: the registry's first mechanism with its
sweet-spot parameters at ℓ = 64 on 10 000 rows of 784 features and 10 one-hot labels,
calibrated to ε = 10 at δ = 1e-5 with its tight accountant. Every noise scale the accountant
declares is drawn on random rows of its width, in chunks of 4096 rows as the worker does.
Both samplers draw from a ``SecureRandom`` (as in a release), in the same process and the same
loop, so their ratio is comparable across machines and loads. Prints one JSON line: the
lattice plans, the one-off table build (timed apart), and for each sampler the median time to
noise the whole release, per row and per entry, and their ratio secure/fast. ``--device``: the
rows live there (both samplers then draw there: ``dpcore.mechanisms.device_draws``), and every
timing waits for the device to finish.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from bench import hints
from dpcore.mechanisms import registry, rounded_gaussian
from dpcore.mechanisms.noise import FastNoise, SecureNoise
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import PublicFacts

CHUNK, FEATURES, CLASSES = 4096, 784, 10


def _width(perturbs: tuple[str, ...]) -> int:
    width = FEATURES * ("features" in perturbs) + CLASSES * ("labels" in perturbs)
    return width or FEATURES


def measure(
    mechanism: str | None = None,
    rows: int = 10_000,
    ell: int = 64,
    epsilon: float = 10.0,
    repeat: int = 3,
    device: str = "cpu",
) -> dict[str, Any]:
    """The benchmark's figures as a dict (what ``main`` prints as one JSON line)."""
    spec = registry.get(mechanism or registry.BUILTIN[0])
    sweet_spot = hints.of(spec.name).sweet_spot
    assert sweet_spot is not None, f"{spec.name} has no sweet-spot parameters"
    params = spec.params.model_validate(sweet_spot(ell, rows, rows // CLASSES))
    facts = PublicFacts(n=rows, n_features=FEATURES, n_classes=CLASSES)
    noise = spec.event_at(Target("tight", epsilon=epsilon, delta=1e-5), params, facts).noise()
    on = torch.device(device)
    values = {s.name: torch.rand((rows, _width(s.perturbs)), device=on) for s in noise.scales}

    rounded_gaussian._table.cache_clear()
    secure = SecureNoise(SecureRandom())  # the release's source, as the worker passes it
    start = time.perf_counter()
    for scale in noise.scales:
        plan = secure.plan(
            sigma=scale.sigma, sensitivity=scale.sensitivity, dim=values[scale.name].shape[1]
        )
        rounded_gaussian.RoundedGaussian(plan.scale)
    build_s = time.perf_counter() - start

    timings: dict[str, list[float]] = {"secure": [], "fast": []}
    for _ in range(repeat):
        for name, sampler in (("secure", secure), ("fast", FastNoise(SecureRandom()))):
            start = time.perf_counter()
            for scale in noise.scales:
                chunks = values[scale.name]
                for at in range(0, chunks.shape[0], CHUNK):
                    sampler(
                        chunks[at : at + CHUNK], sigma=scale.sigma, sensitivity=scale.sensitivity
                    )
            if on.type == "cuda":
                torch.cuda.synchronize(on)
            timings[name].append(time.perf_counter() - start)
    entries = sum(v.numel() for v in values.values())
    secure_s = statistics.median(timings["secure"])
    fast_s = statistics.median(timings["fast"])
    return {
        "mechanism": spec.name,
        "params": params.model_dump(),
        "rows": rows,
        "noised_entries": entries,
        "noise": noise.to_json(),
        "plans": secure.describe(),
        "table_entries": [rounded_gaussian.table_size(p.scale) for p in secure.plans.values()],
        "table_build_s": round(build_s, 3),
        "secure_s": round(secure_s, 3),
        "fast_s": round(fast_s, 3),
        "secure_us_per_row": round(1e6 * secure_s / rows, 2),
        "fast_us_per_row": round(1e6 * fast_s / rows, 2),
        "secure_ns_per_entry": round(1e9 * secure_s / entries, 1),
        "fast_ns_per_entry": round(1e9 * fast_s / entries, 1),
        "ratio_secure_to_fast": round(secure_s / fast_s, 2),
        "device": str(on),
        "torch_threads": torch.get_num_threads(),
        "sigma_increase": max(p.slack for p in secure.plans.values()),
    }


def guide(scales: list[float], bits: list[int], repeat: int = 15) -> list[dict[str, Any]]:
    """Draw time (ns per draw, words excluded) of the rounded Gaussian's table path at each
    scale with each guide size (``_GUIDE_BITS_MAX`` set to it: the tables here are large enough
    to reach it), the sizes alternating within each repeat; medians, and the share of marked
    draws."""
    stream = SecureRandom()
    rows = []
    served = rounded_gaussian._GUIDE_BITS_MAX
    for scale in scales:
        samplers = {}
        try:
            for b in bits:
                rounded_gaussian._GUIDE_BITS_MAX = b
                rounded_gaussian._table.cache_clear()
                samplers[b] = rounded_gaussian.RoundedGaussian(scale)
        finally:
            # The served guide size again, and no table built with another one left cached.
            rounded_gaussian._GUIDE_BITS_MAX = served
            rounded_gaussian._table.cache_clear()
        times: dict[int, list[float]] = {b: [] for b in bits}
        block = rounded_gaussian.BLOCK
        for _ in range(repeat):
            words = stream.words(8 * block)
            for b, sampler in samplers.items():
                start = time.perf_counter()
                for i in range(8):
                    sampler.draw(words[i * block : (i + 1) * block], stream.bytes)
                times[b].append((time.perf_counter() - start) / (8 * block) * 1e9)
        for b, sampler in samplers.items():
            table = sampler.table
            index = (words >> np.uint64(63 - table.guide_bits)).view(np.int64)
            marked = float((np.take(table.guide, index) == rounded_gaussian.GUIDE_MARK).mean())
            rows.append(
                {
                    "scale": scale,
                    "entries": sampler.size,
                    "guide_bits": table.guide_bits,
                    "draw_ns": round(statistics.median(times[b]), 2),
                    "marked": round(marked, 3),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", default=registry.BUILTIN[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--ell", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--guide", nargs="+", type=float, metavar="SCALE", help="time guide sizes at these scales"
    )
    parser.add_argument("--bits", nargs="+", type=int, default=[18, 19, 20, 21])
    args = parser.parse_args()
    if args.guide:
        for row in guide(args.guide, args.bits, args.repeat):
            print(json.dumps(row))
        return
    figures = measure(args.mechanism, args.rows, args.ell, args.epsilon, args.repeat, args.device)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
