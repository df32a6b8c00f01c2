"""The benchmarks' hints for sgdrm (``dpcore.mechanisms.bench_hints``)."""

from __future__ import annotations

from dpcore.mechanisms.bench_hints import BenchCase, BenchHints

_MNIST60K = {"n": 60_000, "mixture_width": 128, "n_samples": 60_000}

# Signed combinations of one-hot labels: regress them, they are not distributions.
BENCH = BenchHints(
    sweep="mixture_width",
    sweet_spot=lambda ell, n, min_class: {"mixture_width": ell, "n_samples": n},
    calibration=(
        BenchCase("tight", 10.0, 1e-5, _MNIST60K),
        BenchCase("paper", 10.0, 1e-5, _MNIST60K),
    ),
)
