"""Bench: the secure source (ChaCha20, dpcore.mechanisms.secure_random) against torch's
generator, at MNIST size: 60 000 × 784 draws, and subsets for T = 10⁴ mixtures of ℓ ∈ {8, 64,
256} of n = 60 000 records. Ratios are taken within one run (same machine, same load).

    python bench/secure_random.py [--repeat 3] [--device cpu|cuda] [--json out.json]

The torch column is what releases did before: torch.randn / torch.rand (float64) on a
seeded torch.Generator, subsets by the former rule (rejection while ℓ² ≤ n, else the ℓ
smallest of n float64 keys, ties unhandled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.former_sampling import uses_rejection
from dpcore.mechanisms import sampling
from dpcore.mechanisms.secure_random import SecureRandom

ROWS, DIM, N, T = 60_000, 784, 60_000, 10_000


def torch_subsets(
    n: int, size: int, count: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """The sampler releases used before (torch generator, float keys)."""
    if size * size <= n:
        out = torch.randint(0, n, (count, size), generator=generator, device=device)
        while True:
            ordered, _ = out.sort(dim=1)
            bad = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1).nonzero().flatten()
            if bad.numel() == 0:
                return out
            out[bad] = torch.randint(0, n, (bad.numel(), size), generator=generator, device=device)
    keys = torch.rand((count, n), generator=generator, device=device, dtype=torch.float64)
    return keys.topk(size, dim=1, largest=False).indices


def in_chunks(draw: Callable[[int], object], ell: int) -> None:
    step = sampling.chunk_size(mixture_degree=ell, dim=DIM + 10, n=N)
    for start in range(0, T, step):
        draw(min(step, T - start))


def timed(fn: Callable[[], object], repeat: int, device: torch.device) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    secure = SecureRandom()
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (ROWS, DIM)
    cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "keystream 60000×784×8 bytes",
            lambda: secure.bytes(ROWS * DIM * 8),
            lambda: torch.randint(
                -(2**63), 2**63 - 1, shape, generator=gen, device=device, dtype=torch.int64
            ),
        ),
        (
            "uniform float64 60000×784",
            lambda: secure.uniform(shape, device=device),
            lambda: torch.rand(shape, generator=gen, device=device, dtype=torch.float64),
        ),
        (
            "normal float32 60000×784 (fast sampler)",
            lambda: secure.normal(shape, device=device, dtype=torch.float32),
            lambda: torch.randn(shape, generator=gen, device=device),
        ),
    ]
    for ell in (8, 64, 256):
        path = "rejection" if uses_rejection(N, ell) else "keys"
        cases.append(
            (
                f"subsets T=1e4, ℓ={ell}, n=6e4 ({path})",
                lambda ell=ell: in_chunks(
                    lambda c: sampling.uniform_subsets(N, ell, c, generator=secure, device=device),
                    ell,
                ),
                lambda ell=ell: in_chunks(lambda c: torch_subsets(N, ell, c, gen, device), ell),
            )
        )
    # The sort-key path at the same size, forced, against the former float-key path.
    cases.append(
        (
            "subsets T=1e4, ℓ=256, n=6e4 (keys, forced)",
            lambda: [sampling._by_keys(N, 256, 512, secure, device) for _ in range(0, T, 512)],
            lambda: [
                torch.rand((512, N), generator=gen, device=device, dtype=torch.float64)
                .topk(256, dim=1, largest=False)
                .indices
                for _ in range(0, T, 512)
            ],
        )
    )
    rows = []
    print(f"{'case':48} {'secure s':>9} {'torch s':>9} {'ratio':>6}")
    for name, ours, theirs in cases:
        a = timed(ours, args.repeat, device)
        b = timed(theirs, args.repeat, device)
        rows.append({"case": name, "secure_s": a, "torch_s": b, "ratio": a / b})
        print(f"{name:48} {a:9.3f} {b:9.3f} {a / b:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
