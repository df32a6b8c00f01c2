"""Mixing throughput of dpmix, dpcda and sgdrm beside plain baselines and the memory bandwidth.

All measured in one process, one run, so the ratios mean something on the machine at hand:

- ``bandwidth``: a large float32 array (1.5 GiB full, 256 MiB quick) read by numpy (one
  thread) and by torch (``torch.get_num_threads()`` threads), and copied by numpy; best of 3.
- per ℓ, two baselines over the same rows: ``numpy`` (uniform ℓ-subsets from numpy's
  ``default_rng``, ``subsets``, then ``X[idx].mean(axis=1)`` in chunks of at most 2^25
  gathered floats, the project's own bound) and ``scipy_csr`` (the T × n CSR mixing matrix
  with 1/ℓ entries, built from the same kind of subsets, times X; its build is timed apart).
- per mechanism and ℓ, the project's generator (``dpcore.mechanisms.<m>.generate.generate``)
  producing all T rows with the fast sampler (``fast``) and with a sampler that adds nothing
  (``kernel``: the subset draw from the secure source and the fused gather-sum, the
  same public function with the noise taken out). Every chunk is consumed as it comes.

Effective GB/s = T·ℓ·d·4 / seconds (the float32 feature bytes a gather-mean must read; labels
are not counted). SGDRM gathers ℓ records per mixture in expectation (Poisson inclusion: a
Binomial(n, ℓ/n) size, then a uniform subset of that size), so the same byte model applies to
it in expectation; it reads its records in float64 (twice the model's bytes), as its rounding
cover assumes. Any generator whose pilot run (512 rows) predicts more than ``max_run_s``
(60 s full, 20 s quick) for T rows is timed on fewer rows and scaled linearly to T
(``scaled_from_rows`` says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from bench.rss import PeakRss
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.secure_random import SecureRandom

GATHER_BUDGET = 1 << 25  # floats per gathered chunk (dpcore.mechanisms.sampling's bound)
SIGMA = 0.05  # any positive value: the fast sampler's cost does not depend on it


@dataclass(frozen=True)
class Sizes:
    n: int
    d: int
    classes: int
    ells: tuple[int, ...]
    rows: int  # T
    bandwidth_mib: int
    # A timed run whose pilot predicts more than this runs on fewer rows, scaled to T.
    max_run_s: float = 60.0


FULL = Sizes(60_000, 784, 10, (16, 64, 256), 60_000, 1536)
QUICK = Sizes(4_000, 784, 10, (16, 64), 4_000, 256, max_run_s=20.0)
PILOT_ROWS = 512


class NoNoise:
    """A noise sampler that adds nothing: the generator's mixing kernel alone."""

    name = "none"

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        return values


def log(message: str) -> None:
    print(f"  [mixing] {message}", file=sys.stderr, flush=True)


def synthetic(sizes: Sizes, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows preprocessed as real data are: features in [0, 1], each row scaled to L2 norm
    ≤ 1 (random ones have norm ≈ √(d/3), so all end at norm 1); class labels 0..k−1."""
    rng = np.random.default_rng(seed)
    x = rng.random((sizes.n, sizes.d), dtype=np.float32)
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return x, rng.integers(0, sizes.classes, sizes.n)


def _best(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bandwidth(mib: int) -> dict[str, Any]:
    """Read (numpy one thread, torch all threads) and copy bandwidth in GB/s (10^9 B/s)."""
    a = np.ones(mib * 1024**2 // 4, dtype=np.float32)
    b = np.empty_like(a)
    t = torch.from_numpy(a)
    size = a.nbytes
    numpy_read = _best(lambda: np.add.reduce(a))
    torch_read = _best(lambda: t.sum())
    copy = _best(lambda: np.copyto(b, a))
    result = {
        "array_bytes": size,
        "numpy_read_gbs": size / numpy_read / 1e9,
        "torch_read_gbs": size / torch_read / 1e9,
        "copy_gbs": 2 * size / copy / 1e9,  # bytes read + bytes written
    }
    result["read_gbs"] = max(result["numpy_read_gbs"], result["torch_read_gbs"])
    return result


def _chunk(ell: int, d: int) -> int:
    return max(1, min(4096, GATHER_BUDGET // (ell * d)))


def subsets(rng: np.random.Generator, n: int, ell: int, count: int) -> np.ndarray:
    """``count`` uniform ℓ-subsets of range(n) (rows of distinct indices): drawn with
    replacement, rows with a repeat drawn again (uniform given distinct; ℓ² ≲ n here)."""
    out = rng.integers(0, n, (count, ell))
    bad = np.arange(count)
    while bad.size:
        ordered = np.sort(out[bad], axis=1)
        bad = bad[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        out[bad] = rng.integers(0, n, (bad.size, ell))
    return out


def numpy_baseline(x: np.ndarray, ell: int, rows: int, seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    n, d = x.shape
    step = _chunk(ell, d)
    draw = kernel = 0.0
    for at in range(0, rows, step):
        count = min(step, rows - at)
        start = time.perf_counter()
        idx = subsets(rng, n, ell, count)
        middle = time.perf_counter()
        x[idx].mean(axis=1)
        kernel += time.perf_counter() - middle
        draw += middle - start
    return {"seconds": draw + kernel, "gather_mean_s": kernel, "index_draw_s": draw}


def scipy_baseline(x: np.ndarray, ell: int, rows: int, seed: int = 2) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    start = time.perf_counter()
    indices = subsets(rng, n, ell, rows).astype(np.int32).ravel()
    indptr = np.arange(0, rows * ell + 1, ell, dtype=np.int64)
    data = np.full(rows * ell, 1.0 / ell, dtype=np.float32)
    matrix = sp.csr_matrix((data, indices, indptr), shape=(rows, n))
    build = time.perf_counter() - start
    start = time.perf_counter()
    matrix @ x
    product = time.perf_counter() - start
    return {"seconds": product, "build_s": build}


def _consume(chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> int:
    produced = 0
    for x, _ in chunks:
        produced += int(x.shape[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return produced


def _generator(
    mechanism: str,
    features: torch.Tensor,
    classes: torch.Tensor,
    onehot: torch.Tensor,
    ell: int,
    rows: int,
    noise: object,
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    source = SecureRandom()
    sampler = FastNoise(source) if noise == "fast" else NoNoise()
    if mechanism == "dpmix":
        from dpcore.mechanisms.dpmix.generate import generate as dpmix

        return dpmix(
            features,
            onehot,
            mixture_degree=ell,
            n_samples=rows,
            sigma_x=SIGMA,
            sigma_y=SIGMA,
            generator=source,
            noise=sampler,
        )
    if mechanism == "dpcda":
        from dpcore.mechanisms.dpcda.generate import generate as dpcda

        return dpcda(
            features,
            classes,
            n_classes=int(onehot.shape[1]),
            mixture_degree=ell,
            n_samples=rows,
            sigma=SIGMA,
            clip_norm=1.0,
            nonnegative=True,
            generator=source,
            noise=sampler,
        )
    if mechanism == "sgdrm":
        from dpcore.mechanisms.sgdrm.generate import generate as sgdrm

        return sgdrm(
            features,
            onehot,
            mixture_width=ell,
            n_samples=rows,
            coefficient_bound=1.0,
            sigma=SIGMA,
            generator=source,
            noise=sampler,
        )
    raise ValueError(mechanism)


def time_generator(
    mechanism: str,
    features: torch.Tensor,
    classes: torch.Tensor,
    onehot: torch.Tensor,
    ell: int,
    rows: int,
    noise: str,
    max_run_s: float = math.inf,
) -> dict[str, Any]:
    """Seconds for the generator to yield ``rows`` rows, after a pilot run (a warm-up) on
    ``PILOT_ROWS``; when the pilot predicts more than ``max_run_s``, fewer rows are timed
    (``rows`` in the result says how many were produced)."""
    device = features.device
    pilot = min(rows, PILOT_ROWS)
    start = time.perf_counter()
    _consume(_generator(mechanism, features, classes, onehot, ell, pilot, noise), device)
    predicted = (time.perf_counter() - start) * rows / pilot
    if predicted > max_run_s:
        rows = max(pilot, int(rows * max_run_s / predicted))
    with PeakRss() as peak:
        start = time.perf_counter()
        produced = _consume(
            _generator(mechanism, features, classes, onehot, ell, rows, noise), device
        )
        seconds = time.perf_counter() - start
    # DPCDA rounds T up to a multiple of the class count.
    return {"seconds": seconds, "rows": produced, **peak.to_json()}


MECHANISMS = ("dpmix", "dpcda", "sgdrm")


def run(
    sizes: Sizes,
    device: str = "cpu",
    bandwidth_result: dict[str, Any] | None = None,
    mechanisms: Sequence[str] = MECHANISMS,
    baselines_too: bool = True,
) -> dict[str, Any]:
    """The mixing section: bandwidth, baselines and the generators at every ℓ (all three
    unless ``mechanisms`` names fewer; ``baselines_too=False`` skips the baselines)."""
    torch_device = torch.device(device)
    x, labels = synthetic(sizes)
    features = torch.from_numpy(x).to(torch_device)
    classes = torch.from_numpy(labels).to(torch_device)
    onehot = torch.nn.functional.one_hot(classes, sizes.classes).to(torch.float32)
    if bandwidth_result is None:
        log(f"memory bandwidth ({sizes.bandwidth_mib} MiB array)")
        bandwidth_result = bandwidth(sizes.bandwidth_mib)
    read = bandwidth_result["read_gbs"]
    out: dict[str, Any] = {
        "sizes": asdict(sizes),
        "device": device,
        "bandwidth": _rounded(bandwidth_result),
        "bytes_model": "T*ell*d*4 (float32 features gathered; labels not counted)",
        "sgdrm_model": "a Binomial(n, ell/n) size and a uniform subset of it per mixture, then "
        "a float64 weighted sum of the ell included records in expectation: the byte model "
        "holds in expectation (its float64 records are twice the bytes)",
        "cases": [],
    }
    for ell in sizes.ells:
        gathered = sizes.rows * ell * sizes.d * 4
        baselines: dict[str, dict[str, float]] = {}
        if baselines_too and device == "cpu":
            log(f"ell={ell}: numpy baseline")
            with PeakRss() as peak:
                baselines["numpy"] = numpy_baseline(x, ell, sizes.rows)
            baselines["numpy"].update(peak.to_json())
            log(f"ell={ell}: scipy CSR baseline")
            with PeakRss() as peak:
                baselines["scipy_csr"] = scipy_baseline(x, ell, sizes.rows)
            baselines["scipy_csr"].update(peak.to_json())
        elif baselines_too:
            log(f"ell={ell}: torch gather-mean baseline on {device}")
            baselines["torch_gather_mean"] = _torch_baseline(features, ell, sizes.rows)
        for name, base in baselines.items():
            base["effective_gbs"] = gathered / base["seconds"] / 1e9
            out["cases"].append(
                {"mechanism": f"baseline:{name}", "ell": ell, "rows": sizes.rows, **_rounded(base)}
            )
        for mechanism in mechanisms:
            rows = sizes.rows
            case: dict[str, Any] = {"mechanism": mechanism, "ell": ell}
            for noise in ("fast", "kernel"):
                log(f"ell={ell}: {mechanism} ({noise}, {rows} rows)")
                try:
                    timed = time_generator(
                        mechanism, features, classes, onehot, ell, rows, noise, sizes.max_run_s
                    )
                except Exception as exc:
                    case[noise] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                produced = timed["rows"]
                seconds = timed["seconds"]
                if produced < sizes.rows:  # run on fewer rows: scaled linearly to T
                    timed["scaled_from_rows"] = produced
                    timed["measured_s"] = seconds
                    seconds = seconds * sizes.rows / produced
                    timed["seconds"] = seconds
                    timed["rows"] = sizes.rows
                timed["rows_per_s"] = timed["rows"] / seconds
                timed["effective_gbs"] = gathered / seconds / 1e9
                timed["ratio_to_read_bandwidth"] = timed["effective_gbs"] / read
                for name, base in baselines.items():
                    timed[f"x_{name}"] = seconds / base["seconds"]
                case[noise] = _rounded(timed)
            out["cases"].append(case)
    return out


def _torch_baseline(features: torch.Tensor, ell: int, rows: int) -> dict[str, float]:
    n, d = features.shape
    step = _chunk(ell, d)
    generator = torch.Generator(device=features.device).manual_seed(3)
    torch.cuda.synchronize(features.device)
    start = time.perf_counter()
    for at in range(0, rows, step):
        count = min(step, rows - at)
        idx = torch.randint(0, n, (count, ell), device=features.device, generator=generator)
        features[idx].mean(dim=1)
    torch.cuda.synchronize(features.device)
    return {"seconds": time.perf_counter() - start}


def gpu(sizes: Sizes) -> dict[str, Any]:
    """The mixing section on ``cuda`` features (with the device's own read bandwidth), or a
    ``skipped`` line when there is no GPU."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device here (torch.cuda.is_available() is False)"}
    device = torch.device("cuda")
    array = [torch.ones(sizes.bandwidth_mib * 1024**2 // 4, device=device)]
    size = array[0].numel() * 4

    def read() -> None:
        array[0].sum()
        torch.cuda.synchronize(device)

    band = {"array_bytes": size, "read_gbs": size / _best(read) / 1e9}
    array.clear()
    result = run(sizes, "cuda", band)
    result["name"] = torch.cuda.get_device_name(device)
    result["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return result


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    def one(v: Any) -> Any:
        if isinstance(v, float) and math.isfinite(v) and v != 0:
            return float(f"{v:.4g}")
        return v

    return {k: one(v) for k, v in values.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m bench.mixing [--quick] [--mechanisms M ...] [--ells L ...] [--no-baselines]``:
    the mixing section alone (all of it by default, as ``make bench`` runs it), its table on
    stdout; a quicker way to measure one generator than the whole suite."""
    parser = argparse.ArgumentParser(prog="python -m bench.mixing", description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help="the smoke sizes")
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    parser.add_argument("--ells", nargs="+", type=int, help="these ℓ (default: the sizes' own)")
    parser.add_argument("--no-baselines", action="store_true", help="skip numpy and scipy")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.ells:
        sizes = dataclasses.replace(sizes, ells=tuple(args.ells))
    start = time.perf_counter()
    result = run(sizes, mechanisms=args.mechanisms, baselines_too=not args.no_baselines)
    from bench import report

    entry = {"seconds": round(time.perf_counter() - start, 1), "status": "ok", "result": result}
    print(report.tables({"sections": {"mixing": entry}}))
    return result


if __name__ == "__main__":
    main()
