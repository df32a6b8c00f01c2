"""The benchmarks' hints for dpmix (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

_MNIST = {"n": 10_000, "mixture_degree": 64, "n_samples": 10_000, "d_x": 784, "d_y": 10}

BENCH = BenchHints(
    sweep="mixture_degree",
    sweet_spot=lambda ell, n, min_class: {"mixture_degree": ell, "n_samples": n},
    calibration=(
        # The guide's "MNIST at full size" release: MNIST test split, ℓ = 64, T = 10000, ε = 10.
        BenchCase("tight", 10.0, 1e-5, _MNIST),
        # The accountant's speed target at scale: n = T = 10^6.
        BenchCase("tight", 1.0, 1e-6, {"n": 10**6, "mixture_degree": 64, "n_samples": 10**6}),
        BenchCase("tight", 1.0, 1e-5, {**_MNIST, "assignment": "record"}),
        BenchCase("paper", 10.0, 1e-5, _MNIST),
    ),
)
