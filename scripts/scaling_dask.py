"""Measure the distributed jobs of worker/dask_release.py on a LocalCluster (docs/scaling.md).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python scripts/scaling_dask.py --n 100000 --d 32 \
        --mechanism record --workers 2 --partition-rows 25000

Writes a synthetic dataset as Parquet row groups (values in [0, 1], K classes), runs the job
with the declared fast noise from fresh OS keys, and prints one JSON line: wall time of the
job (cluster start-up apart), rows/s read, bytes read and shuffled (the cost model's
figures), and the peak RSS of each worker process. Synthetic data only: the figures are about
the engine, not a dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

import numpy as np


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--ell", type=int, default=64)
    ap.add_argument("--T", type=int, default=None, help="mixtures (default n)")
    ap.add_argument("--mechanism", choices=["record", "dpcda"], default="record")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", action="store_true", help="thread workers (processes=False)")
    ap.add_argument("--partition-rows", type=int, default=25_000)
    ap.add_argument("--noise", choices=["fast", "secure"], default="fast")
    ap.add_argument(
        "--single", action="store_true", help="the single-machine generator instead (baseline)"
    )
    args = ap.parse_args()
    if args.single:
        _single(args)
        return

    from dpcore.distributed import record
    from dpcore.distributed.tasks import FreshKeys, NoiseSpec
    from dpcore.mechanisms.run import noise_for
    from dpcore.mechanisms.spec import PublicFacts
    from dpcore.preprocessing import RowTransform
    from worker import dask_release as dr

    n, d, K = args.n, args.d, args.classes
    T = args.T or n
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp(prefix="dprelease-scaling-")
    path = os.path.join(tmp, "data.parquet")
    names = [f"f{j}" for j in range(d)]
    X = rng.random((n, d), dtype=np.float32).astype(np.float64)
    labels = rng.integers(0, K, n)
    dr.write_partitions(path, X, labels.tolist(), names, "label", args.partition_rows)
    del X
    parts = dr.discover([path])
    columns = dr.Columns(tuple(names), "label", tuple(range(K)))
    facts = PublicFacts(n=n, n_features=d, n_classes=K)

    t0 = time.perf_counter()
    client = dr.client_for(None, workers=args.workers, processes=not args.threads)
    startup = time.perf_counter() - t0
    out: dict[str, object] = {
        "mechanism": args.mechanism,
        "n": n,
        "d": d,
        "K": K,
        "ell": args.ell,
        "T": T,
        "partitions": len(parts),
        "workers": args.workers,
        "processes": not args.threads,
        "noise": args.noise,
        "cluster_startup_s": round(startup, 2),
        "bytes_read": n * (d + 1) * 8,
    }
    from distributed import get_task_stream

    stream = get_task_stream(client)
    stream.__enter__()
    t0 = time.perf_counter()
    rows = 0
    if args.mechanism == "record":
        params = {"mixture_degree": args.ell, "n_samples": T, "assignment": "record"}
        declared = noise_for("dpmix", params, facts, sigma=1.0, sigma_y=1.0)
        transform = RowTransform.unit_range(np.zeros(d), np.ones(d), 1.0)
        plan = record.RecordPlan.make(
            n=n, mixture_degree=args.ell, n_samples=T, dim_x=d, dim_y=K, min_buckets=len(parts)
        )
        out["k"] = plan.k
        out["buckets"] = plan.buckets
        out["dense_partials"] = plan.dense(args.partition_rows)
        out["bytes_shuffled"] = record.bytes_shuffled(plan, [p.rows for p in parts])
        for x, _ in dr.record_release(
            client,
            parts,
            columns,
            transform,
            mixture_degree=args.ell,
            n_samples=T,
            sigma_x=1.0,
            sigma_y=1.0,
            noise=NoiseSpec(args.noise, declared),
            keys=FreshKeys(),
        ):
            rows += x.shape[0]
    else:
        params = {
            "mixture_degree": args.ell,
            "n_samples": T,
            "min_class_size": args.ell,
            "standardization": "unit_range",
            "clip_norm": 1.0,
            "class_sizes": "declared",  # the Dask job's (DP class sizes run locally)
        }
        declared = noise_for("dpcda", params, facts, sigma=1.0)
        transform = RowTransform.unit_range(np.zeros(d), np.ones(d), 1.0, divide=False)
        # routed gathers: every member row once (float64) plus its request (two int64)
        out["bytes_shuffled"] = T * args.ell * (d * 8 + 16)
        for x, _ in dr.class_release(
            client,
            parts,
            columns,
            transform,
            mixture_degree=args.ell,
            n_samples=T,
            sigma=1.0,
            clip_norm=1.0,
            nonnegative=True,
            noise=NoiseSpec(args.noise, declared),
            keys=FreshKeys(),
        ):
            rows += x.shape[0]
    wall = time.perf_counter() - t0
    stream.__exit__(None, None, None)
    compute: dict[str, float] = {}
    transfer = 0.0
    for task in stream.data:
        key = task["key"][0] if isinstance(task["key"], tuple) else str(task["key"])
        name = key.split("-", 1)[0]
        for phase in task["startstops"]:
            span = phase["stop"] - phase["start"]
            if phase["action"] == "compute":
                compute[name] = compute.get(name, 0.0) + span
            elif phase["action"] == "transfer":
                transfer += span
    out["task_compute_s"] = {k: round(v, 2) for k, v in sorted(compute.items())}
    out["task_transfer_s"] = round(transfer, 2)
    out["rows_out"] = rows
    out["job_s"] = round(wall, 2)
    out["input_rows_per_s"] = round(n / wall)
    out["worker_peak_rss_mb"] = (
        sorted(round(v) for v in client.run(_peak_rss_mb).values()) if not args.threads else None
    )
    out["driver_peak_rss_mb"] = round(_peak_rss_mb())
    client.close()
    print(json.dumps(out))


def _single(args: argparse.Namespace) -> None:
    """The same data and noise through the single-machine generator, in this process."""
    import torch

    from dpcore.mechanisms.dpcda.generate import generate
    from dpcore.mechanisms.dpmix.generate import generate_by_record
    from dpcore.mechanisms.noise import sampler
    from dpcore.mechanisms.secure_random import SecureRandom

    n, d, K = args.n, args.d, args.classes
    T = args.T or n
    rng = np.random.default_rng(0)
    X = torch.from_numpy(rng.random((n, d), dtype=np.float32) / np.sqrt(d, dtype=np.float32))
    labels = rng.integers(0, K, n)
    source = SecureRandom()
    noise = sampler(args.noise, source)
    t0 = time.perf_counter()
    if args.mechanism == "record":
        Y = torch.from_numpy(np.eye(K, dtype=np.float32)[labels])
        chunks = generate_by_record(
            X,
            Y,
            mixture_degree=args.ell,
            n_samples=T,
            sigma_x=1.0,
            sigma_y=1.0,
            generator=source,
            noise=noise,
        )
    else:
        chunks = generate(
            X,
            torch.from_numpy(labels),
            n_classes=K,
            mixture_degree=args.ell,
            n_samples=T,
            sigma=1.0,
            clip_norm=1.0,
            nonnegative=True,
            generator=source,
            noise=noise,
        )
    rows = sum(x.shape[0] for x, _ in chunks)
    wall = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "mechanism": args.mechanism,
                "single_machine": True,
                "n": n,
                "d": d,
                "K": K,
                "ell": args.ell,
                "T": T,
                "noise": args.noise,
                "rows_out": rows,
                "job_s": round(wall, 2),
                "input_rows_per_s": round(n / wall),
                "peak_rss_mb": round(_peak_rss_mb()),
            }
        )
    )


if __name__ == "__main__":
    main()
