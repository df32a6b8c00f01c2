"""Micro-bench: the mixing kernels (subset sampling and gather-and-average) before and after
the issue-16 fast paths, at MNIST size (n = 60 000, d = 784), ℓ ∈ {16, 64, 256}.

    OMP_NUM_THREADS=1 python bench/mixing_kernels.py [--T 60000] [--ell 16 64 256]
        [--threads 1] [--old-rows 0] [--sgdrm-old-rows 256] [--json out.json]

Per ℓ, on the same data and the same machine, in one run:

- dpmix (mixture assignment): subset sampling, old (whole-row rejection while it is cheap,
  else the ℓ smallest of n sort keys; ``sampling._by_keys``) and new
  (``sampling.uniform_subsets``), and the reduction, old (``features[idx].double().mean(1)``)
  and new (``sampling.gather_sum``, float32 blocks of 64 added in float64), both on the same
  indices; plus the whole new ``dpmix.generate`` with a pass-through noise sampler;
- dpcda: Floyd's sampler, old (the O(ℓ²) membership scan) and new (``floyd_indices``), on a
  class of n/10 records, and the reduction as above;
- sgdrm: inclusion bits and mixing, old (``SecureRandom.bernoulli``, 4 bytes an entry, dense
  count × n coefficients @ records) and new (``sampling.lazy_bernoulli``, ~1 byte an entry,
  weighted ``embedding_bag`` over the included records). The old dense product costs
  count·n·d flops: it is timed on ``--sgdrm-old-rows`` mixtures and scaled to T (marked);
- baselines: a plain numpy gather+mean (float32) and a scipy CSR mixing-matrix product
  (entries 1/ℓ, float32), on the new path's indices.

Effective GB/s = T·ℓ·d·4 bytes (the rows a mixture reads, float32) / seconds. Noise is not
timed. ``--old-rows`` > 0 times the old dpmix/dpcda paths on that many mixtures and scales
to T (the old ℓ = 256 path takes minutes at T = 60 000); 0 runs them at T.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.former_sampling import uses_rejection
from dpcore.mechanisms import sampling
from dpcore.mechanisms.dpmix.generate import generate as dpmix_generate
from dpcore.mechanisms.secure_random import SecureRandom

N, DIM, K = 60_000, 784, 10
OLD_BUDGET = 1 << 25


# --- the former code, verbatim in substance ------------------------------------------------


def old_chunk(ell: int, dim: int) -> int:
    by_gather = OLD_BUDGET // max(1, ell * dim)
    by_keys = OLD_BUDGET // N if not uses_rejection(N, ell) else 1 << 16
    return max(1, min(4096, by_gather, by_keys))


def old_subsets(n: int, ell: int, count: int, gen: SecureRandom) -> torch.Tensor:
    if not uses_rejection(n, ell):
        return sampling._by_keys(n, ell, count, gen, torch.device("cpu"))
    out = gen.integers(n, (count, ell))
    bad = np.arange(count)
    while bad.size:
        ordered = np.sort(out[bad], axis=1)
        bad = bad[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        if bad.size:
            out[bad] = gen.integers(n, (bad.size, ell))
    return torch.from_numpy(out)


def old_floyd(n: int, ell: int, count: int, gen: SecureRandom) -> np.ndarray:
    out = np.empty((count, ell), dtype=np.int64)
    for i, j in enumerate(range(n - ell, n)):
        t = gen.integers(j + 1, count)
        taken = (out[:, :i] == t[:, None]).any(axis=1)
        out[:, i] = np.where(taken, j, t)
    return out


# --- timing ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = fn()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        return out


def passthrough(
    values: torch.Tensor,
    *,
    sigma: float,
    sensitivity: float,
    error: float = 0.0,
    unit: float | None = None,
):  # type: ignore[no-untyped-def]
    return values


def bench_ell(
    ell: int, T: int, X: torch.Tensor, Y: torch.Tensor, old_rows: int, sgdrm_old_rows: int
) -> list[tuple[str, float, bool]]:
    """(case, seconds for T mixtures, extrapolated?) rows."""
    gen = SecureRandom.from_seed(ell)
    Xn = X.numpy()
    rows: list[tuple[str, float, bool]] = []
    old_T = min(T, old_rows) if old_rows > 0 else T
    old_scale = T / old_T

    # dpmix, old: sampler and reduction in the old chunks
    clock = Clock()
    step = old_chunk(ell, DIM + K)
    for start in range(0, old_T, step):
        count = min(step, old_T - start)
        idx = clock.run("sample", lambda count=count: old_subsets(N, ell, count, gen))
        clock.run("reduce", lambda idx=idx: (X[idx].double().mean(1), Y[idx].double().mean(1)))
    rows += [
        ("dpmix old: subsets", clock.seconds["sample"] * old_scale, old_scale > 1),
        ("dpmix old: gather .double().mean", clock.seconds["reduce"] * old_scale, old_scale > 1),
    ]
    # dpmix, new; the baselines on the same indices
    clock = Clock()
    step = sampling.chunk_size(mixture_degree=ell, dim=DIM + K, n=N)
    for start in range(0, T, step):
        count = min(step, T - start)
        idx = clock.run(
            "sample",
            lambda count=count: sampling.uniform_subsets(
                N, ell, count, generator=gen, device=torch.device("cpu")
            ),
        )
        clock.run(
            "reduce",
            lambda idx=idx: (
                sampling.gather_sum(X, idx) / ell,
                sampling.gather_sum(Y, idx) / ell,
            ),
        )
        flat = idx.numpy()
        clock.run("numpy", lambda flat=flat: Xn[flat].mean(axis=1))
        clock.run("csr", lambda flat=flat, count=count: csr_mix(flat, count, ell) @ Xn)
    rows += [
        ("dpmix new: subsets", clock.seconds["sample"], False),
        ("dpmix new: gather_sum", clock.seconds["reduce"], False),
        ("baseline: numpy X[idx].mean(1) (float32)", clock.seconds["numpy"], False),
        ("baseline: scipy CSR (1/ℓ) @ X (float32)", clock.seconds["csr"], False),
    ]
    start_time = time.perf_counter()
    for _ in dpmix_generate(
        X,
        Y,
        mixture_degree=ell,
        n_samples=T,
        sigma_x=1.0,
        sigma_y=1.0,
        generator=gen,
        noise=passthrough,  # type: ignore[arg-type]
    ):
        pass
    rows.append(
        ("dpmix new: generate() end to end, no noise", time.perf_counter() - start_time, False)
    )

    # dpcda: one class of n/10 records (T mixtures from it: same work per mixture)
    n_class = N // K
    clock = Clock()
    step = sampling.chunk_size(mixture_degree=ell, dim=DIM, n=N)
    for start in range(0, old_T, step):
        count = min(step, old_T - start)
        local = clock.run("sample", lambda count=count: old_floyd(n_class, ell, count, gen))
        chosen = torch.from_numpy(local)
        clock.run("reduce", lambda chosen=chosen: X[chosen].double().mean(1))
    rows += [
        ("dpcda old: Floyd (scan)", clock.seconds["sample"] * old_scale, old_scale > 1),
        ("dpcda old: gather .double().mean", clock.seconds["reduce"] * old_scale, old_scale > 1),
    ]
    clock = Clock()
    for start in range(0, T, step):
        count = min(step, T - start)
        local = clock.run(
            "sample",
            lambda count=count: sampling.floyd_indices(n_class, ell, count, generator=gen),
        )
        chosen = torch.from_numpy(local)
        clock.run("reduce", lambda chosen=chosen: sampling.gather_sum(X, chosen) / ell)
    rows += [
        ("dpcda new: Floyd (chains)", clock.seconds["sample"], False),
        ("dpcda new: gather_sum", clock.seconds["reduce"], False),
    ]

    # sgdrm: inclusion + mixing (coefficients drawn as in the generator, not timed apart)
    records = torch.cat((X.double(), Y.double()), dim=1)
    old_sg = min(T, sgdrm_old_rows) if sgdrm_old_rows > 0 else T
    clock = Clock()
    step = max(1, min(4096, (1 << 24) // N))
    for start in range(0, old_sg, step):
        count = min(step, old_sg - start)
        inc = clock.run(
            "bits", lambda count=count: torch.from_numpy(gen.bernoulli(ell, N, (count, N)))
        )

        def dense(inc: torch.Tensor = inc, count: int = count) -> torch.Tensor:
            g = gen.normal((int(inc.sum()),)) / math.sqrt(ell)
            coefficients = torch.zeros((count, N), dtype=torch.float64)
            coefficients[inc] = g
            return coefficients @ records

        clock.run("mix", dense)
    rows += [
        ("sgdrm old: Bernoulli, 4 B/entry", clock.seconds["bits"] * T / old_sg, old_sg < T),
        ("sgdrm old: dense coefficients @ records", clock.seconds["mix"] * T / old_sg, old_sg < T),
    ]
    clock = Clock()
    step = max(1, min(4096, (1 << 25) // N))
    for start in range(0, T, step):
        count = min(step, T - start)
        inc = clock.run(
            "bits", lambda count=count: sampling.lazy_bernoulli(ell, N, (count, N), generator=gen)
        )

        def sparse(inc: np.ndarray = inc, count: int = count) -> torch.Tensor:
            which, members = np.nonzero(inc)
            g = gen.normal((members.size,)) / math.sqrt(ell)
            offsets = np.zeros(count, dtype=np.int64)
            np.cumsum(np.bincount(which, minlength=count)[:-1], out=offsets[1:])
            return torch.nn.functional.embedding_bag(
                torch.from_numpy(members),
                records,
                torch.from_numpy(offsets),
                mode="sum",
                per_sample_weights=g,
            )

        clock.run("mix", sparse)
    rows += [
        ("sgdrm new: lazy Bernoulli, ~1 B/entry", clock.seconds["bits"], False),
        ("sgdrm new: weighted embedding_bag", clock.seconds["mix"], False),
    ]
    return rows


def csr_mix(flat: np.ndarray, count: int, ell: int) -> Any:
    import scipy.sparse as sp

    data = np.full(count * ell, 1.0 / ell, dtype=np.float32)
    return sp.csr_matrix(
        (data, flat.reshape(-1), np.arange(0, count * ell + 1, ell)), shape=(count, N)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=60_000)
    parser.add_argument("--ell", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--old-rows", type=int, default=0)
    parser.add_argument("--sgdrm-old-rows", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    features = rng.uniform(0, 1, (N, DIM)).astype(np.float32)
    features /= np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1.0)
    X = torch.from_numpy(features)
    Y = torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, K, N)), K).float()
    print(f"n={N} d={DIM} T={args.T} threads={args.threads} (~ = timed on fewer rows, scaled)")
    print(f"{'ℓ':>4} {'case':48} {'seconds':>9} {'GB/s':>7}")
    results = []
    for ell in args.ell:
        for case, seconds, scaled in bench_ell(
            ell, args.T, X, Y, args.old_rows, args.sgdrm_old_rows
        ):
            gbs = args.T * ell * DIM * 4 / seconds / 1e9
            mark = "~" if scaled else " "
            print(f"{ell:>4} {case:48} {mark}{seconds:8.3f} {gbs:7.2f}", flush=True)
            results.append({"ell": ell, "case": case, "seconds": seconds, "scaled": scaled})
    if args.json:
        args.json.write_text(json.dumps({"T": args.T, "threads": args.threads, "rows": results}))


if __name__ == "__main__":
    main()
