"""The benchmarks' hints for dpcda (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

_MNIST_SWEET = {
    "n": 10_000,
    "mixture_degree": 64,
    "n_samples": 10_000,
    "clip_norm": 1.0,
    "n_classes": 10,
}

BENCH = BenchHints(
    sweep="mixture_degree",
    # The studies on public datasets (MNIST, the tables) declare the smallest class:
    # class sizes 'declared', as measured (docs/results).
    sweet_spot=lambda ell, n, min_class: {
        "mixture_degree": ell,
        "n_samples": n,
        "min_class_size": min_class,
        "class_sizes": "declared",
    },
    max_sweep=lambda n, min_class: min_class,
    calibration=(
        BenchCase(
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
                "class_sizes": "declared",
            },
        ),
        # The MNIST sweet spot (smallest class 892): PLD of both cases.
        BenchCase(
            "tight",
            1.0,
            1e-5,
            {**_MNIST_SWEET, "min_class_size": 892, "class_sizes": "declared"},
        ),
        BenchCase(
            "tight",
            1.0,
            1e-5,
            {**_MNIST_SWEET, "min_class_size": 750, "class_sizes": "dp", "count_noise": 20.0},
        ),
    ),
)
