"""The benchmarks' hints for aim (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

BENCH = BenchHints(
    sweet_spot=lambda ell, n, min_class: {},
    calibration=(BenchCase("tight", 1.0, 1e-5, {"n_columns": 30, "rounds": 496}),),
)
