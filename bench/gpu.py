"""The mechanisms on CUDA: one MNIST-10k release per case on ``cuda`` and on ``cpu`` in the same
process, timed, with the peak CUDA memory, the outputs' shapes and finiteness, the device the
released chunks were computed on, and ridge (and, for clustmix dp, logistic) accuracy on the
5000 held-out test images; then a scale case, clustmix dp on n = 10^6 synthetic rows of MNIST
width, on cuda alone. One JSON line per case on stdout, a markdown table at ``--out``.

    python bench/gpu.py --shared SHARED --out OUT.md [--devices cuda cpu] [--cases ...]
        [--rows N] [--scale-rows 1000000] [--scale-device cuda] [--no-accuracy]

SHARED holds ``datasets/mnist-t10k`` (bench/mnist.py's ``load_private``). Every release is
made as ``bench.sweet_spot.make_release`` makes it (the mechanism's params model, the accountant
calibrated to (ε, δ), a fresh secure source and the ``secure`` sampler (``fast`` for the
``*_fast`` cases), ``build``,
``materialise``) but on the device asked for; calibration runs once per case and both devices
release under the same event. The cached lookup tables (the rounded-Gaussian CDF table, the DCT
basis) are cleared before each release so that neither device inherits the other's. A case
that fails is recorded with the key lines of its traceback and the others go on.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mnist import DELTA, load_private, load_test  # noqa: E402
from bench.sweet_spot import release_metadata, request_params  # noqa: E402
from dpcore.evaluation import Release, evaluate  # noqa: E402
from dpcore.mechanisms import registry  # noqa: E402
from dpcore.mechanisms.planning import Target  # noqa: E402
from dpcore.mechanisms.run import (  # noqa: E402
    build,
    facts_of,
    materialise,
    params_of,
    randomness,
)
from service.datasets.parsing import ParsedDataset  # noqa: E402

EPSILON = 1.0


@dataclass(frozen=True)
class Case:
    """One release request: the mechanism, its request params (given the private set) and
    the accountant it is calibrated with."""

    name: str
    mechanism: str
    request: Callable[[ParsedDataset], dict[str, Any]]
    accountant: str = "tight"
    families: tuple[str, ...] = ("linear",)
    sampler: str = "secure"


def _sweet(mechanism: str, ell: int) -> Callable[[ParsedDataset], dict[str, Any]]:
    """The sweet-spot study's params at ℓ (``bench.sweet_spot.request_params``)."""

    def request(parsed: ParsedDataset) -> dict[str, Any]:
        counts = np.bincount(parsed.labels)
        return request_params(registry.get(mechanism), ell, parsed.n_rows, int(counts.min()), {})

    return request


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        # Default params (K = 16 clusters per class), 2000 rows as in the sweet-spot study.
        Case(
            "clustmix_dp",
            "clustmix",
            lambda _: {"n_samples": 2000},
            families=("linear", "logistic"),
        ),
        # The dp variant's options: k-means on random Fourier features, DP-KIP (K = 8).
        Case(
            "clustmix_rff",
            "clustmix",
            lambda _: {"n_samples": 2000, "clusters_per_class": 8, "feature_map": "rff"},
            families=("linear", "logistic"),
        ),
        Case(
            "clustmix_dpkip",
            "clustmix",
            lambda _: {"n_samples": 2000, "clusters_per_class": 8, "dpkip_steps": 50},
            families=("linear", "logistic"),
        ),
        # Algorithm 2 of the paper (research reproduction: its own accountant).
        Case(
            "clustmix_paper",
            "clustmix",
            lambda _: {"variant": "paper", "n_samples": 2000, "sigma_max": 1.0},
            accountant="paper",
        ),
        # ℓ at the sweet spots of docs/results/sweet_spot.md (ε = 1); sgdrm at the ℓ of its
        # calibration case; n_samples = n (``request_params``).
        Case("dpmix", "dpmix", _sweet("dpmix", 16)),
        Case("dpcda", "dpcda", _sweet("dpcda", 64)),
        # No accuracy: its rows are signed combinations for its own learner (bias-corrected SGD).
        Case("sgdrm", "sgdrm", _sweet("sgdrm", 128), families=()),
        # The same releases with the ``fast`` sampler (float Gaussian noise): both samplers
        # compute their stream and draws on the device (``dpcore.mechanisms.device_draws``).
        Case("clustmix_dp_fast", "clustmix", lambda _: {"n_samples": 2000}, sampler="fast"),
        Case("dpmix_fast", "dpmix", _sweet("dpmix", 16), sampler="fast"),
        # DPGM with its defaults (a VAE per class, 100 DP-SGD steps of batch 2000 on
        # MNIST-10k), secure and fast: the training job the gpu queue exists for.
        Case("dpgm", "dpgm", lambda _: {}, families=("linear", "logistic")),
        Case("dpgm_fast", "dpgm", lambda _: {}, families=("linear", "logistic"), sampler="fast"),
    )
}
SCALE = Case("clustmix_dp_scale", "clustmix", lambda _: {"n_samples": 2000}, families=())


def clear_caches() -> None:
    """Forget the lookup tables a previous release built (fair per-device timings)."""
    from dpcore.mechanisms import basis, device_draws, rounded_gaussian

    rounded_gaussian._table.cache_clear()
    device_draws._device_table.cache_clear()
    basis.dct_basis.cache_clear()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(device: torch.device) -> float:
    """CUDA context, cuBLAS handles and the allocator, before anything is timed."""
    start = time.perf_counter()
    for dtype in (torch.float32, torch.float64):
        a = torch.ones((256, 256), dtype=dtype, device=device)
        (a @ a).sum().item()
    synchronize(device)
    return time.perf_counter() - start


@dataclass
class Drawn:
    """One device's release: its rows, the chunks' devices and dtypes, seconds, peak CUDA
    memory."""

    X: np.ndarray
    Y: np.ndarray
    seconds: float
    chunk_devices: set[str] = field(default_factory=set)
    chunk_dtypes: set[str] = field(default_factory=set)
    peak_mib: float | None = None


def _recording(
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]], drawn: Drawn
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, y in chunks:
        drawn.chunk_devices |= {str(x.device), str(y.device)}
        drawn.chunk_dtypes |= {str(x.dtype), str(y.dtype)}
        yield x, y


def release_on(
    mechanism: str,
    params: Any,
    parsed: ParsedDataset,
    event: Any,
    device: torch.device,
    noise_sampler: str = "secure",
) -> Drawn:
    """``sweet_spot.make_release``'s release step on ``device``: a fresh secure source and
    sampler, ``build``, every chunk drawn (``materialise``, which also post-processes)."""
    clear_caches()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    generator, noise_draws = randomness(noise_sampler)
    output = build(
        registry.get(mechanism),
        params,
        parsed,
        noise=event.noise(),
        sampler=noise_draws,
        generator=generator,
        device=device,
    )
    drawn = Drawn(np.zeros(0), np.zeros(0), 0.0)
    output.chunks = _recording(output.chunks, drawn)
    X, Y, _, _ = materialise(output)
    synchronize(device)
    drawn.seconds = time.perf_counter() - start
    drawn.X, drawn.Y = X, Y
    if device.type == "cuda":
        drawn.peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    return drawn


def as_release(mechanism: str, params: Any, parsed: ParsedDataset, drawn: Drawn) -> Release:
    """The release as ``make_release`` returns it (evaluation reads its metadata)."""
    metadata = release_metadata(mechanism, params, parsed)
    return Release(drawn.X.astype(np.float64), drawn.Y.astype(np.float64), metadata)


def failure(exc: BaseException) -> dict[str, Any]:
    """The key lines of a traceback: the error and the last frames in this repository."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if str(ROOT) in f.filename][-5:]
    if frames and (not ours or frames[-1] is not ours[-1]):
        ours.append(frames[-1])  # where it was raised, outside this repository
    where = [
        f"{Path(f.filename).resolve().relative_to(ROOT) if str(ROOT) in f.filename else f.filename}"
        f":{f.lineno} in {f.name}: {(f.line or '').strip()}"
        for f in ours
    ]
    return {"error": f"{type(exc).__name__}: {exc}".strip()[:600], "where": where}


def run_case(
    case: Case,
    parsed: ParsedDataset,
    devices: list[torch.device],
    test: tuple[np.ndarray, np.ndarray] | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"case": case.name, "mechanism": case.mechanism, "n": parsed.n_rows}
    try:
        spec = registry.get(case.mechanism)
        params = params_of(spec, case.request(parsed))
        row["params"] = {k: v for k, v in params.model_dump().items() if v is not None}
        target = Target(case.accountant, epsilon=EPSILON, delta=DELTA)
        start = time.perf_counter()
        event = spec.event_at(target, params, facts_of(parsed))
        row["accountant"] = case.accountant
        row["sampler"] = case.sampler
        row["calibrate_s"] = round(time.perf_counter() - start, 3)
        row["sigma"] = float(event.noise().sigma_x)
        row["epsilon"] = float(event.epsilon(DELTA))
    except Exception as exc:
        row["calibration_failed"] = failure(exc)
        return row
    shapes: dict[str, list[int]] = {}
    for device in devices:
        key = device.type
        try:
            drawn = release_on(case.mechanism, params, parsed, event, device, case.sampler)
        except Exception as exc:
            row[f"{key}_failed"] = failure(exc)
            continue
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        row[f"{key}_s"] = round(drawn.seconds, 3)
        if drawn.peak_mib is not None:
            row[f"{key}_peak_mib"] = round(drawn.peak_mib, 1)
        shapes[key] = [*drawn.X.shape, *drawn.Y.shape[1:]]
        row[f"{key}_shape"] = shapes[key]
        row[f"{key}_finite"] = bool(np.isfinite(drawn.X).all() and np.isfinite(drawn.Y).all())
        row[f"{key}_chunks_on"] = sorted(drawn.chunk_devices)
        row[f"{key}_chunk_dtypes"] = sorted(drawn.chunk_dtypes)
        if test is not None and case.families and len(drawn.X):
            try:
                release = as_release(case.mechanism, params, parsed, drawn)
                report = evaluate(release, test[0], test[1], classifiers=case.families)
                row[f"{key}_accuracy"] = {
                    f: None if a is None else round(a, 4) for f, a in report["accuracy"].items()
                }
            except Exception as exc:
                row[f"{key}_accuracy_failed"] = failure(exc)
    if "cuda_s" in row and "cpu_s" in row and row["cuda_s"] > 0:
        row["cpu_over_cuda"] = round(row["cpu_s"] / row["cuda_s"], 2)
    if len(shapes) > 1:
        row["same_shape"] = len({tuple(s) for s in shapes.values()}) == 1
    return row


def synthetic(n: int, seed: int = 0, width: int = 28, classes: int = 10) -> ParsedDataset:
    """n rows of MNIST width (28 × 28 = 784 values in [0, 255], uint8-like) in ``classes``
    classes: a random prototype image per class plus noise, parsed as bench/mnist.py's private
    set is (float64 features, declared range [0, 255], classes not declared)."""
    rng = np.random.default_rng(seed)
    d = width * width
    labels = rng.integers(0, classes, size=n)
    prototypes = rng.integers(0, 256, size=(classes, d)).astype(np.int16)
    X = np.empty((n, d), dtype=np.float64)
    block = 1 << 16
    for start in range(0, n, block):
        stop = min(n, start + block)
        noise = rng.integers(-64, 65, size=(stop - start, d), dtype=np.int16)
        X[start:stop] = np.clip(prototypes[labels[start:stop]] + noise, 0, 255)
    return ParsedDataset(
        X=X,
        feature_shape=(width, width),
        feature_names=[str(i) for i in range(d)],
        labels=labels.astype(np.int64),
        classes=list(range(classes)),
        classes_declared=False,
        lo=np.zeros(d),
        hi=np.full(d, 255.0),
        clipped_values=0,
    )


def subset(parsed: ParsedDataset, rows: int) -> ParsedDataset:
    return dataclasses.replace(parsed, X=parsed.X[:rows], labels=parsed.labels[:rows])


def _cell(row: Mapping[str, Any], key: str, fmt: str = "{:.2f}") -> str:
    value = row.get(key)
    if f"{key.rsplit('_', 1)[0]}_failed" in row and value is None:
        return "FAILED"
    return "—" if value is None else fmt.format(value)


def _accuracy(row: Mapping[str, Any], key: str) -> str:
    acc = row.get(f"{key}_accuracy")
    if not acc:
        return "FAILED" if f"{key}_accuracy_failed" in row else "—"
    return ", ".join(f"{f} {a:.3f}" for f, a in acc.items() if a is not None)


def table(rows: list[dict[str, Any]], command: str, device_name: str) -> str:
    lines = [
        "| case | n | sampler | σ_x | cuda s | cpu s | cpu/cuda | peak CUDA MiB | "
        "shape (cuda / cpu) | finite | chunks on (cuda run) | accuracy cuda | accuracy cpu |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = " / ".join(
            "×".join(str(s) for s in r[f"{k}_shape"]) if f"{k}_shape" in r else "—"
            for k in ("cuda", "cpu")
        )
        finite = ", ".join(
            f"{k} {'yes' if r[f'{k}_finite'] else 'NO'}"
            for k in ("cuda", "cpu")
            if f"{k}_finite" in r
        )
        sigma = r.get("sigma")
        lines.append(
            f"| {r['case']} | {r['n']} | {r.get('sampler', '—')} | "
            f"{'—' if sigma is None else f'{sigma:.4g}'} | "
            f"{_cell(r, 'cuda_s')} | {_cell(r, 'cpu_s')} | {_cell(r, 'cpu_over_cuda')} | "
            f"{_cell(r, 'cuda_peak_mib', '{:.0f}')} | {shape} | {finite or '—'} | "
            f"{', '.join(r.get('cuda_chunks_on', [])) or '—'} | {_accuracy(r, 'cuda')} | "
            f"{_accuracy(r, 'cpu')} |"
        )
    failures = [(r["case"], k, r[k]) for r in rows for k in sorted(r) if k.endswith("_failed")]
    out = [
        "# dprelease mechanisms on CUDA",
        "",
        f"Made by: `{command}`",
        "",
        f"Device: {device_name}; ε = {EPSILON:g}, δ = {DELTA:g} (tight accountant; paper for "
        "clustmix_paper); `secure` noise sampler except the `*_fast` cases; seconds are "
        "build + materialise of one release (calibration excluded, run once per case), "
        "CUDA synchronised; peak CUDA memory is torch.cuda.max_memory_allocated, reset per "
        "release.",
        "",
        *lines,
        "",
    ]
    if failures:
        out += ["## Failures", ""]
        for case, key, info in failures:
            out.append(f"- **{case}** ({key.removesuffix('_failed')}): `{info['error']}`")
            out += [f"  - `{w}`" for w in info["where"]]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, required=True, help="holds datasets/mnist-t10k")
    parser.add_argument("--out", type=Path, required=True, help="the markdown table")
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rows", type=int, default=None, help="first N MNIST rows only")
    parser.add_argument(
        "--scale-rows", type=int, default=1_000_000, help="0: no scale case (cuda only)"
    )
    parser.add_argument(
        "--scale-device", default="cuda", help="the scale case's device (cpu: a local check)"
    )
    parser.add_argument("--no-accuracy", action="store_true")
    args = parser.parse_args(argv)
    command = "python bench/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    devices = [torch.device(d) for d in args.devices]
    cuda = next((d for d in devices if d.type == "cuda"), None)
    device_name = torch.cuda.get_device_name(cuda) if cuda is not None else "cpu only"
    head: dict[str, Any] = {
        "device": device_name,
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
    }
    if cuda is not None:
        head["cuda_warm_up_s"] = round(warm_up(cuda), 3)
    print(json.dumps(head), flush=True)
    parsed = load_private(args.shared)
    if args.rows:
        parsed = subset(parsed, args.rows)
    test = None if args.no_accuracy else load_test()
    rows = []
    for name in args.cases:
        row = run_case(CASES[name], parsed, devices, test)
        rows.append(row)
        print(json.dumps(row), flush=True)
    scale_device = torch.device(args.scale_device)
    if args.scale_rows and (scale_device.type != "cuda" or cuda is not None):
        del parsed
        gc.collect()
        start = time.perf_counter()
        try:
            big = synthetic(args.scale_rows)
        except Exception as exc:
            rows.append({"case": SCALE.name, "n": args.scale_rows, "data_failed": failure(exc)})
        else:
            data_s = round(time.perf_counter() - start, 1)
            row = {**run_case(SCALE, big, [scale_device], None), "synthetic_data_s": data_s}
            rows.append(row)
            del big
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table(rows, command, device_name))


if __name__ == "__main__":
    main()
