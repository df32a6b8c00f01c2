"""The benchmarks' hints for local_perturbation (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

BENCH = BenchHints(
    sweet_spot=lambda ell, n, min_class: {},
    calibration=(BenchCase("tight", 10.0, 1e-5, {"n": 10_000}),),
)
