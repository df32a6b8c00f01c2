"""The benchmarks' hints for dpgm (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

BENCH = BenchHints(
    # No mixture degree: the study makes one release per ε with the defaults.
    sweet_spot=lambda ell, n, min_class: {},
    calibration=(
        BenchCase(
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
    ),
)
