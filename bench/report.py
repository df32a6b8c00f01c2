"""bench/suite.py's JSON as Markdown: a header that says what each figure is, the command, the
machine and the date, then one table per section (``tables`` alone is what the suite prints).

    python bench/report.py docs/results/bench.json   # rewrites docs/results/bench.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HEADER = """\
# `make bench`: the benchmark suite

Written by `bench/suite.py` (`make bench`, or `python bench/suite.py [--quick] [--only
SECTION ...]`) from the JSON beside this file; every figure below comes from the one run whose
command, machine and date are given, so ratios between them are meaningful (speed goals are
stated as such ratios, never as timed tests). A `--quick` run uses small sizes and is a smoke
test, not a measurement.

What each figure is:

- **Memory bandwidth**: a large float32 array summed by numpy (one thread) and by torch (all
  threads), and copied by numpy (bytes read + written); best of 3, in GB/s (10⁹ B/s). "read" is
  the faster of the two sums: the reference for the mixing ratios.
- **Mixing throughput**: time for each generator (`dpcore.mechanisms.<m>.generate.generate`)
  to yield all T rows from n preprocessed random rows (features in [0, 1], rows of L2 norm 1,
  10 classes), with the fast noise sampler (`fast`) and with a sampler that adds nothing
  (`kernel`: subset draw from the secure source + fused gather-sum, i.e. the generator
  without its noise). Effective GB/s = T·ℓ·d·4 / s, the feature bytes a gather-mean must
  read; "of read bw" divides it by the read bandwidth; "× numpy" and "× CSR" are the
  generator's seconds over the baselines' (> 1: slower than the baseline). Baselines, on the
  same rows: numpy (uniform ℓ-subsets from `default_rng`, `X[idx].mean(axis=1)` in chunks
  of ≤ 2²⁵ gathered floats; its subset draw is included) and scipy (the T × n CSR mixing
  matrix with 1/ℓ entries @ X; the matrix build is not included). SGDRM gathers ℓ records per
  mixture in expectation (a Binomial(n, ℓ/n) size, then a uniform subset of it: the byte model
  holds in expectation), read in float64 as its rounding cover assumes. Any generator whose
  512-row pilot predicts more than a minute (20 s quick) for T rows is timed on fewer rows and
  scaled linearly to T, and marked so ("from N rows"). Peak RSS is sampled (every 10 ms)
  during the timed run.
- **Secure vs fast noise**: the guide's MNIST release's noise (dpmix, ℓ = 64, ε = 10, δ = 1e-5,
  calibrated by its tight accountant) drawn on random rows of 784 features and 10 labels, in
  chunks of 4096 rows as the worker does, by `SecureNoise` and `FastNoise`
  (`dpcore/mechanisms/noise.py`); median of the repeats; the one-off lattice table build is
  timed apart (`bench/noise.py`).
- **Calibration**: per accountant benchmark case (the mechanisms' specs), one calibration
  (smallest noise for the target ε) and one ε evaluation at a fresh σ (`bench/calibration.py`).
- **End-to-end release**: through the HTTP API with the Python client, seconds for the upload,
  `POST /releases` (admission: calibration and the ledger), the job (polled every 0.1 s until
  succeeded) and the download (sha256 checked). `embedded` is `make run`'s stack (SQLite,
  local files, jobs in the API process); `real` is Postgres + Redis + a Celery worker (solo
  pool) + S3 (moto behind the tests' SigV4 check, in the bench's own process), to which the
  job's release file and the owner's raw copy go up in 8 MiB parts while they are written (a
  multipart upload, completed when the job publishes: architecture.md, step 5; measured in
  implementation.md, "Uploading while writing"). The guide's MNIST release is MNIST t10k (or
  random images of its shape), dpmix ℓ = 64, T = 10 000, ε = 10; the 10⁶-row case is a
  16-feature, 2-class table (dpmix ℓ = 16, ε = 1), whose release (10⁶ × 18 × 4 B = 72 MB)
  fits under the default `DPRELEASE_MAX_RELEASE_BYTES` (2 GiB) — a 784-wide one would not.
  The noise sampler is the API's default (`secure`). Peak RSS is the VmHWM of the process that
  ran the job (a fresh one per case).
- **Admission**: `POST /releases/preview` and `POST /releases` sent by C concurrent clients
  (bounded in count and time), the same small dpmix body on a 2 000-row table with a budget
  that admits them all (the calibration is cached after a first preview, so this is the
  ledger's and the API's own cost); accepted answers per second, p50 / p99 latency, statuses.
- **GPU**: the mixing section on `cuda` features with the device's read bandwidth and a torch
  gather-mean baseline; skipped, with the reason, where `torch.cuda.is_available()` is false.
"""


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def _table(head: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _mixing(result: dict[str, Any]) -> str:
    sizes = result["sizes"]
    band = result["bandwidth"]
    out = [
        f"n = {sizes['n']}, d = {sizes['d']}, T = {sizes['rows']}, device {result['device']}; "
        f"read {_cell(band['read_gbs'])} GB/s (numpy {_cell(band.get('numpy_read_gbs'))}, "
        f"torch {_cell(band.get('torch_read_gbs'))}), copy {_cell(band.get('copy_gbs'))} GB/s "
        f"over a {band['array_bytes'] / 2**20:.0f} MiB array.",
        "",
    ]
    rows = []
    for case in result["cases"]:
        if case["mechanism"].startswith("baseline:"):
            rows.append(
                [
                    case["mechanism"],
                    case["ell"],
                    "–",
                    case["seconds"],
                    "–",
                    case["effective_gbs"],
                    case["effective_gbs"] / band["read_gbs"],
                    "–",
                    "–",
                    case.get("peak_rss_mib"),
                ]
            )
            continue
        for noise in ("fast", "kernel"):
            timed = case.get(noise, {})
            if "error" in timed:
                rows.append([case["mechanism"], case["ell"], noise, timed["error"]] + [""] * 6)
                continue
            scaled = (
                f" (from {timed['scaled_from_rows']} rows)" if "scaled_from_rows" in timed else ""
            )
            rows.append(
                [
                    case["mechanism"],
                    case["ell"],
                    noise,
                    f"{_cell(timed['seconds'])}{scaled}",
                    timed.get("rows_per_s"),
                    timed.get("effective_gbs"),
                    timed.get("ratio_to_read_bandwidth"),
                    timed.get("x_numpy", timed.get("x_torch_gather_mean")),
                    timed.get("x_scipy_csr"),
                    timed.get("peak_rss_mib"),
                ]
            )
    base = "× numpy" if result["device"] == "cpu" else "× torch gather-mean"
    head = ["mechanism", "ℓ", "noise", "s", "rows/s", "eff. GB/s", "of read bw", base]
    head += ["× CSR", "peak RSS MiB"]
    out.append(_table(head, rows))
    return "\n".join(out)


def _noise(r: dict[str, Any]) -> str:
    head = ["rows", "entries", "secure s", "fast s", "secure/fast", "ns/entry (secure)"]
    head += ["table build s", "σ increase", "threads"]
    row = [r["rows"], r["noised_entries"], r["secure_s"], r["fast_s"], r["ratio_secure_to_fast"]]
    row += [r["secure_ns_per_entry"], r["table_build_s"], r["sigma_increase"], r["torch_threads"]]
    return _table(head, [row])


def _calibration(cases: list[dict[str, Any]]) -> str:
    head = ["mechanism", "accountant", "ε", "δ", "keys", "calibration s", "one ε evaluation s"]
    rows = [
        [
            c["mechanism"],
            c["accountant"],
            c["target_epsilon"],
            c["delta"],
            c["keys"],
            c["calibration_s"],
            c["one_evaluation_s"],
        ]
        for c in cases
    ]
    return _table(head, rows)


def _by_mode(result: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for mode, entries in result.items():
        if isinstance(entries, dict):  # the whole mode failed
            yield {"mode": mode, "error": entries.get("error")}
        else:
            yield from entries


def _e2e(result: dict[str, Any]) -> str:
    head = ["mode", "case", "dataset", "T", "upload s", "admit s", "job s", "download s"]
    head += ["total s", "peak RSS MiB", "job eff. GB/s", "of read bw"]
    rows = []
    for e in _by_mode(result):
        if "error" in e:
            rows.append([e["mode"], e.get("case", "–"), f"error: {e['error']}"] + [""] * 9)
            continue
        rows.append(
            [
                e["mode"],
                e["case"],
                e["dataset"],
                e["rows"],
                e["upload_s"],
                e["admit_s"],
                e["run_s"],
                e["download_s"],
                e["total_s"],
                e["peak_rss_mib"],
                e.get("effective_gbs", "–"),
                e.get("of_read_bw", "–"),
            ]
        )
    return _table(head, rows)


def _admission(result: dict[str, Any]) -> str:
    head = ["mode", "path", "clients", "requests", "s", "accepted/s", "p50 ms", "p99 ms"]
    head += ["statuses"]
    rows = []
    for e in _by_mode(result):
        if "error" in e:
            rows.append([e["mode"], f"error: {e['error']}"] + [""] * 7)
            continue
        rows.append(
            [
                e["mode"],
                e["path"],
                e["clients"],
                e["requests"],
                e["seconds"],
                e["accepted_per_s"],
                e["p50_ms"],
                e["p99_ms"],
                e["statuses"],
            ]
        )
    return _table(head, rows)


def _gpu(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"Skipped: {result['skipped']}."
    return (
        f"{result.get('name')}, peak CUDA memory {result.get('peak_cuda_mib')} MiB.\n\n"
        + _mixing(result)
    )


TITLES: dict[str, tuple[str, Callable[[Any], str]]] = {
    "mixing": ("Mixing throughput", _mixing),
    "noise": ("Secure vs fast noise", _noise),
    "calibration": ("Calibration", _calibration),
    "e2e": ("End-to-end release latency", _e2e),
    "admission": ("Admission", _admission),
    "gpu": ("GPU", _gpu),
}


def tables(results: dict[str, Any]) -> str:
    parts = []
    for name, entry in results["sections"].items():
        title, render_one = TITLES[name]
        parts.append(f"## {title} (`{name}`, {entry['seconds']} s)\n")
        if entry["status"] != "ok":
            parts.append(f"Failed: {entry['error']}\n")
            continue
        try:
            parts.append(render_one(entry["result"]) + "\n")
        except Exception as exc:  # a table that cannot be drawn leaves the JSON as it is
            parts.append(f"(no table: {type(exc).__name__}: {exc}; see the JSON)\n")
    return "\n".join(parts)


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    kind = "**quick run (smoke sizes, not a measurement)**" if results["quick"] else "full run"
    lines = [
        HEADER,
        "## This run\n",
        f"- {kind}: `{results['command']}`, {results['date']}, {results['seconds']} s in all",
        f"- machine: {m['cpu_model']}, {m['cpus_usable']} usable of {m['cpu_count']} CPUs, "
        f"{m['memory_gib']} GiB; {m['platform']}; GPU: {m['cuda'] or 'none'}",
        f"- Python {m['python']}, numpy {m['numpy']}, scipy {m['scipy']}, torch {m['torch']}; "
        f"threads: torch {m['torch_threads']} (interop {m['torch_interop_threads']}), "
        + ", ".join(f"{k}={v}" for k, v in m["thread_env"].items()),
        f"- commit {m['git_commit']}{' (with local changes)' if m['git_dirty'] else ''}; "
        f"API stacks: {', '.join(results['modes'])}",
        "",
        tables(results),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    source = Path(sys.argv[1])
    source.with_suffix(".md").write_text(render(json.loads(source.read_text())))
