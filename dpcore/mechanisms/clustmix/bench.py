"""The benchmarks' hints for clustmix (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

BENCH = BenchHints(
    sweep="clusters_per_class",
    sweet_spot=lambda k, n, min_class: {"clusters_per_class": k},
    calibration=(
        BenchCase(
            "tight",
            1.0,
            1e-5,
            {
                "clusters_per_class": 16,
                "kmeans_refine": 1,
                "kmeans_share": 0.5,
                "count_share": 0.1,
            },
        ),
        BenchCase("paper", 1.0, 1e-5, {"cluster_size": 118, "n_classes": 10, "n_features": 784}),
    ),
)
