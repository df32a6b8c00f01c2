"""How much the secure sampler raises each mechanism's noise: σ'/σ per declared noise at
MNIST-10k shapes (n = 10 000, d = 784, 10 classes), calibrated to ε = 1 at δ = 1e-5.

Usage: OMP_NUM_THREADS=1 python bench/noise_inflation.py [--speed]

Plans only (nothing is drawn, no data): each noise is planned as its mechanism calls the
sampler — the width of the row it noises, its replace-one sensitivity and the unit its
analysis is stated for (DP-SGD and DP-KIP: one record's contribution; DPGM's gradient row
holds every network's parameters). The figure is the lattice's part, g√d/u; the float cover
e/u adds the per-mechanism figures of docs/privacy.md ("Rounding of the noised rows"),
≤ 3.5·10⁻⁴ at ℓ = 64 and ~10⁻⁷ for the DP-SGD sums. Prints one JSON line per noise;
``--speed`` adds one line timing a DPGM step's gradient noise at 10 networks (table-free)
against the ``fast`` sampler, both from a ``SecureRandom``, median of 3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from bench import hints
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix import dpkip
from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpgm.models import VAE
from dpcore.mechanisms.noise import FastNoise, SecureNoise, lattice_plan
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import PublicFacts

N, D, CLASSES, ELL, EPSILON, DELTA = 10_000, 784, 10, 64, 1.0, 1e-5


def _vae_parameters() -> int:
    shapes = VAE(D, 200, 2).init(1, lambda shape: torch.zeros(shape))
    return sum(v.numel() for v in shapes.values())


def _calls(mechanism: str, params: dict[str, Any], networks: int) -> dict[str, tuple[int, float]]:
    """(width, unit) of each noise's sampler call where it is not the row of features or
    labels at unit Δ."""
    if mechanism == "dpgm":
        return {
            "gradients": (networks * _vae_parameters(), dpsgd.GRADIENT_RADIUS),
            "norm_histogram": (50, dpsgd.HISTOGRAM_RADIUS),
            "kmeans": (1, 1.0),  # the clusters' sizes (K = 1: no k-means steps)
        }
    if mechanism == "random_projection":
        # The projected rows, k wide; the sensitivity is the declared one (√2 times the
        # spectral norm).
        return {"features": (int(params["projection_dim"]), 0.0)}
    if mechanism == "clustmix":
        centres = CLASSES * params.get("clusters_per_class", 1)
        return {
            "counts": (1, 1.0),
            "kmeans_counts": (1, 1.0),
            "kmeans_sums": (2 * 200, 1.0) if params.get("feature_map") == "rff" else (D, 1.0),
            "kip": (centres * D, dpkip.RADIUS),
        }
    return {}


def inflation(mechanism: str, params: dict[str, Any], label: str, networks: int = CLASSES):
    spec = registry.get(mechanism)
    validated = spec.params.model_validate(params)
    facts = PublicFacts(n=N, n_features=D, n_classes=networks if mechanism == "dpgm" else CLASSES)
    event = spec.event_at(Target("tight", epsilon=EPSILON, delta=DELTA), validated, facts)
    calls = _calls(mechanism, params, networks)
    for scale in event.noise().scales:
        width = D if "features" in scale.perturbs else CLASSES if "labels" in scale.perturbs else D
        width, unit = calls.get(scale.name, (width, scale.sensitivity))
        unit = unit or scale.sensitivity
        plan = lattice_plan(sigma=scale.sigma, sensitivity=scale.sensitivity, dim=width, unit=unit)
        yield {
            "release": label,
            "noise": scale.name,
            "sigma": round(scale.sigma, 4),
            "sensitivity": round(scale.sensitivity, 5),
            "unit": round(unit, 5),
            "width": width,
            "table_free": not plan.tabled,
            "sigma_ratio": round(plan.sigma_effective / scale.sigma, 6),
        }


RELEASES: list[tuple[str, dict[str, Any], str, int]] = [
    ("dpmix", {"mixture_degree": ELL, "n_samples": N}, "dpmix ℓ=64", CLASSES),
    (
        "dpcda",
        hints.of("dpcda").sweet_spot(ELL, N, N // CLASSES),  # type: ignore[misc]
        "dpcda ℓ=64",
        CLASSES,
    ),
    ("sgdrm", {"mixture_width": ELL, "n_samples": N}, "sgdrm ℓ=64", CLASSES),
    ("local_perturbation", {}, "local_perturbation", CLASSES),
    ("random_projection", {"projection_dim": 50}, "random_projection k=50", CLASSES),
    ("clustmix", {}, "clustmix dp (defaults)", CLASSES),
    ("clustmix", {"clusters_per_class": 4, "feature_map": "rff"}, "clustmix dp rff K=4", CLASSES),
    ("clustmix", {"clusters_per_class": 4, "dpkip_steps": 200}, "clustmix dp-kip K=4", CLASSES),
    ("dpgm", {}, "dpgm 1 network", 1),
    ("dpgm", {}, "dpgm 10 networks", 10),
]


def speed(repeat: int = 3) -> dict[str, Any]:
    """One DP-SGD step's gradient noise of DPGM at 10 networks, secure against fast."""
    row = next(r for r in inflation("dpgm", {}, "dpgm", 10) if r["noise"] == "gradients")
    values = torch.rand((1, row["width"]), dtype=torch.float64)
    call = {"sigma": row["sigma"], "sensitivity": row["sensitivity"], "unit": row["unit"]}
    secure, fast = SecureNoise(SecureRandom()), FastNoise(SecureRandom())
    secure(values, **call)  # the span layout, built once (cached)
    timings: dict[str, list[float]] = {"secure": [], "fast": []}
    for _ in range(repeat):
        for name, sampler in (("secure", secure), ("fast", fast)):
            start = time.perf_counter()
            sampler(values, **call)
            timings[name].append(time.perf_counter() - start)
    secure_s, fast_s = statistics.median(timings["secure"]), statistics.median(timings["fast"])
    return {
        "speed": "dpgm 10 networks, one step's gradient noise",
        "entries": row["width"],
        "table_free": row["table_free"],
        "secure_s": round(secure_s, 3),
        "fast_s": round(fast_s, 3),
        "secure_ns_per_entry": round(1e9 * secure_s / row["width"], 1),
        "fast_ns_per_entry": round(1e9 * fast_s / row["width"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true")
    args = parser.parse_args()
    for mechanism, params, label, networks in RELEASES:
        for row in inflation(mechanism, params, label, networks):
            print(json.dumps(row, ensure_ascii=False))
    if args.speed:
        print(json.dumps(speed(), ensure_ascii=False))


if __name__ == "__main__":
    main()
