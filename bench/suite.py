"""The benchmark suite behind ``make bench``: every figure measured in one run, one JSON.

    python bench/suite.py [--quick] [--only SECTION ...] [--modes embedded real]
        [--threads N] [--out docs/results/bench.json]

Sections (each runs on its own with ``--only``; one that fails is recorded with its error in
the JSON and the others still run; progress goes to stderr):

- ``mixing``: memory bandwidth, then dpmix, dpcda and sgdrm generating T rows at each ℓ (fast
  noise, and the noise-free kernel) beside numpy and scipy CSR baselines (bench/mixing.py);
- ``noise``: the secure against the fast noise sampler per row (bench/noise.py);
- ``calibration``: calibration and one ε evaluation of every accountant (bench/calibration.py);
- ``e2e``: upload → release → download latency through the HTTP API (bench/api_latency.py);
- ``admission``: ``POST /releases`` and ``/releases/preview`` under concurrent clients;
- ``gpu``: the mixing section on ``cuda`` features, or a line saying it was skipped.

Writes the JSON at ``--out`` and, beside it, the same name in ``.md`` (bench/report.py): the
command, the machine, the date and a table per section; prints the tables on stdout.
``--quick`` is a smoke run (small n and T, embedded mode only unless ``--modes`` says
otherwise) and writes ``bench-quick.json`` by default. Threads: ``--threads`` (default: the
CPUs this process may use) sets OMP/MKL/OpenBLAS before numpy and torch load, and
``torch.set_num_threads``; both are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench/ is on sys.path, not the root
    sys.path.insert(0, str(ROOT))

SECTIONS = ("mixing", "noise", "calibration", "e2e", "admission", "gpu")
MODES = ("embedded", "real")
RESULTS = ROOT / "docs" / "results"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Rows of the noise section (the guide's MNIST release's noise on 784 + 10 columns).
NOISE_ROWS = {"quick": 2_000, "full": 60_000}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- sections: (args) -> JSON-able result -----------------------------------------------------


def _mixing(args: argparse.Namespace) -> Any:
    from bench import mixing

    return mixing.run(mixing.QUICK if args.quick else mixing.FULL)


def _gpu(args: argparse.Namespace) -> Any:
    from bench import mixing

    return mixing.gpu(mixing.QUICK if args.quick else mixing.FULL)


def _noise(args: argparse.Namespace) -> Any:
    from bench import noise

    rows = NOISE_ROWS["quick" if args.quick else "full"]
    result = noise.measure(rows=rows, repeat=1 if args.quick else 3)
    result["chunk_rows"] = noise.CHUNK
    return result


def _calibration(args: argparse.Namespace) -> Any:
    from bench import calibration

    return list(calibration.measure(quick=args.quick))


def _e2e(args: argparse.Namespace) -> Any:
    from bench import api_latency

    return api_latency.run("e2e", tuple(args.modes), args.quick)


def _admission(args: argparse.Namespace) -> Any:
    from bench import api_latency

    return api_latency.run("admission", tuple(args.modes), args.quick)


RUNNERS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "mixing": _mixing,
    "noise": _noise,
    "calibration": _calibration,
    "e2e": _e2e,
    "admission": _admission,
    "gpu": _gpu,
}


# -- the machine ------------------------------------------------------------------------------


def _first(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git(*command: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *command], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    import numpy
    import scipy
    import torch

    memory = _first("/proc/meminfo", "MemTotal")
    status = _git("status", "--porcelain")
    return {
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "thread_env": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


# -- the driver -------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="these sections only")
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, help="API stacks (default: both; --quick: embedded)"
    )
    parser.add_argument("--threads", type=int, help="CPU threads (default: the usable CPUs)")
    parser.add_argument("--out", type=Path, help="the JSON (default docs/results/bench.json)")
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = ["embedded"] if args.quick else list(MODES)
    if args.out is None:
        args.out = RESULTS / ("bench-quick.json" if args.quick else "bench.json")
    if args.threads is None:
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        args.threads = len(usable) if usable else os.cpu_count() or 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    # Before numpy or torch load: their thread pools read these once.
    for name in THREAD_VARIABLES:
        os.environ[name] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    command = "python bench/suite.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    results: dict[str, Any] = {
        "command": command.strip(),
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "threads": args.threads,
        "modes": args.modes,
        "machine": machine(),
        "sections": {},
    }
    started = time.perf_counter()
    for name in args.only or SECTIONS:
        log(f"{name}: started")
        start = time.perf_counter()
        try:
            entry: dict[str, Any] = {"status": "ok", "result": RUNNERS[name](args)}
        except Exception as exc:  # recorded; the other sections still run
            entry = {
                "status": "error",
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
        entry["seconds"] = round(time.perf_counter() - start, 1)
        results["sections"][name] = entry
        log(f"{name}: {entry['status']} in {entry['seconds']} s")
    results["seconds"] = round(time.perf_counter() - started, 1)

    from bench import report

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.render(results)
    args.out.with_suffix(".md").write_text(markdown)
    print(report.tables(results))
    log(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
