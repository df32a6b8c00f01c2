"""Tabular study: ClustMix beside DPMix, DP-CDA and the baselines on small and large tables.

Usage:
    python bench/tabular.py --out docs/results [--epsilon 1] [--repeats 3] [--quick]

Data (bundled with scikit-learn, nothing downloaded): breast-cancer (569 × 30, 2 classes),
digits (1797 × 64, 10 classes), wine (178 × 13, 3 classes), and ``make_classification``
(n = 50 000, 20 features, 2 classes, scikit-learn's defaults otherwise, random_state 0). Each
table is split once (stratified, 70 % private / 30 % held-out test, seed 0). The private part is
parsed as the service parses an upload, with per-column bounds declared public: digits' pixel
range [0, 16] is documented; for the others the bounds stand in for what an owner reads off a
data dictionary — each column's range over the whole table widened by 5 % on each side
(a study shortcut: a real owner must not take them from the private rows).

Every release is calibrated with the `tight` accountant to ε at δ = 1/n (n the private rows) and
made by the same code the service runs; logistic regression and HistGradientBoosting (scikit-
learn defaults, hard labels) are trained on the release as served and tested on the held-out
rows: accuracy and ROC AUC (binary: of the positive class; multi-class: macro one-vs-rest).
Each configuration runs ``--repeats`` times (fresh secure randomness each time); the table
reports the mean and the spread (max − min). The ε = ∞ row trains the same models on the
private rows themselves.

Rows go to OUT/tabular.csv; OUT/tabular.md and OUT/tabular.png are written at the end.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sweet_spot import make_release, request_params  # noqa: E402
from dpcore.evaluation import class_indices, preprocess_test  # noqa: E402
from dpcore.mechanisms import registry  # noqa: E402
from service.datasets.parsing import ParsedDataset, parse_dataset  # noqa: E402
from service.datasets.schemas import Budget, DatasetMetadata  # noqa: E402

MODELS = ("logistic", "hgb")
METRICS = ("accuracy", "auc")


def _breast_cancer() -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return X, y, None


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X, y, np.array([[0.0, 16.0]] * X.shape[1])  # documented pixel range


def _wine() -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    return X, y, None


def _synthetic() -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=50_000, n_features=20, random_state=0)
    return X, y, None


DATASETS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray | None]]] = {
    "breast_cancer": _breast_cancer,
    "digits": _digits,
    "wine": _wine,
    "make_classification": _synthetic,
}

# (mechanism, value of its sweep parameter or None, further request params) per configuration:
# ClustMix over clusters per class, the mixing mechanisms over ℓ, the baselines once. Requests
# are the mechanisms' sweet-spot hints (bench.sweet_spot.request_params) with these merged in,
# and one released row per private row wherever the mechanism takes n_samples.
CONFIGS: tuple[tuple[str, int | None, dict[str, Any]], ...] = (
    ("clustmix", 1, {}),
    ("clustmix", 2, {"kmeans_refine": 0}),
    ("clustmix", 4, {"kmeans_refine": 0}),
    ("clustmix", 16, {}),
    ("dpmix", 4, {}),
    ("dpmix", 16, {}),
    ("dpcda", 4, {}),
    ("dpcda", 16, {}),
    ("local_perturbation", None, {}),
    ("random_projection", None, {"projection_dim": 10}),
)


def declared_bounds(X: np.ndarray, documented: np.ndarray | None) -> np.ndarray:
    if documented is not None:
        return documented
    lo, hi = X.min(axis=0), X.max(axis=0)
    pad = 0.05 * np.maximum(hi - lo, 1e-9)
    return np.stack([lo - pad, hi + pad], axis=1)


def split(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.3, stratify=y, random_state=0
    )
    return X_train, X_test, y_train, y_test


def parse(name: str, X: np.ndarray, y: np.ndarray, bounds: np.ndarray) -> ParsedDataset:
    buffer = io.BytesIO()
    np.savez(buffer, X=X.astype(np.float64), y=y)
    meta = DatasetMetadata(
        name=name,
        feature_range={str(j): (float(lo), float(hi)) for j, (lo, hi) in enumerate(bounds)},
        budget=Budget(epsilon=100, delta=min(0.5, 1.0 / len(X))),
    )
    return parse_dataset(
        content=buffer.getvalue(), filename=f"{name}.npz", metadata=meta, max_bytes=10**9
    )


def scores(
    X: np.ndarray, labels: np.ndarray, n_classes: int, Xt: np.ndarray, yt: np.ndarray
) -> dict[str, float]:
    """Accuracy and AUC of each model trained on (X, labels), tested on (Xt, yt)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    out: dict[str, float] = {}
    present = np.unique(labels)
    for model in MODELS:
        start = time.perf_counter()
        if len(present) == 0:
            # An empty release: nothing to learn from, every class equally likely.
            proba = np.full((len(Xt), n_classes), 1.0 / n_classes)
        elif len(present) < 2:
            # A release holding one class: every model predicts it.
            proba = np.zeros((len(Xt), n_classes))
            proba[:, present[0]] = 1.0
        else:
            clf = (
                LogisticRegression(max_iter=1000)
                if model == "logistic"
                else HistGradientBoostingClassifier()
            )
            clf.fit(X, labels)
            proba = np.zeros((len(Xt), n_classes))
            proba[:, clf.classes_] = clf.predict_proba(Xt)
        out[f"{model}_accuracy"] = float((proba.argmax(axis=1) == yt).mean())
        if n_classes == 2:
            out[f"{model}_auc"] = float(roc_auc_score(yt, proba[:, 1]))
        else:
            out[f"{model}_auc"] = float(
                roc_auc_score(
                    yt, proba, multi_class="ovr", average="macro", labels=range(n_classes)
                )
            )
        out[f"{model}_s"] = round(time.perf_counter() - start, 3)
    return out


def run_one(
    dataset: str,
    parsed: ParsedDataset,
    X_test: np.ndarray,
    y_test: np.ndarray,
    mechanism: str,
    sweep: int | None,
    extra: Mapping[str, Any],
    epsilon: float,
    delta: float,
) -> dict[str, Any]:
    start = time.perf_counter()
    spec = registry.get(mechanism)
    min_class = int(np.bincount(parsed.labels).min())
    params = request_params(spec, sweep, parsed.n_rows, min_class, extra)
    if "n_samples" in spec.params.model_fields:
        params.setdefault("n_samples", parsed.n_rows)
    shown = {spec.bench.sweep: sweep, **extra} if spec.bench.sweep else dict(extra)
    release, event = make_release(mechanism, params, parsed, epsilon, delta)
    Xt = preprocess_test(release, X_test)
    yt = class_indices(release, y_test)
    row: dict[str, Any] = {
        "dataset": dataset,
        "mechanism": mechanism,
        "params": json.dumps(shown, sort_keys=True),
        "epsilon": epsilon,
        "delta": delta,
        "rows": len(release.X),
        "charge": event.epsilon(delta),
    }
    labels = release.Y.argmax(axis=1) if len(release.X) else np.zeros(0, dtype=np.int64)
    row.update(scores(release.X, labels, len(parsed.classes), Xt, yt))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def non_private(
    dataset: str, parsed: ParsedDataset, X_test: np.ndarray, y_test: np.ndarray
) -> dict[str, Any]:
    """The same models on the private rows (ε = ∞), in the same unit scale."""
    from dpcore.preprocessing import unit_features

    start = time.perf_counter()
    lookup = {str(c): i for i, c in enumerate(parsed.classes)}
    yt = np.array([lookup[str(v)] for v in y_test])
    Xt = unit_features(X_test.reshape(len(X_test), -1), parsed.lo, parsed.hi)
    row: dict[str, Any] = {
        "dataset": dataset,
        "mechanism": "non-private",
        "params": "",
        "epsilon": float("inf"),
        "delta": 0.0,
        "rows": parsed.n_rows,
        "charge": float("inf"),
    }
    X = unit_features(parsed.X, parsed.lo, parsed.hi)
    row.update(scores(X, parsed.labels, len(parsed.classes), Xt, yt))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


FIELDS = [
    "dataset",
    "mechanism",
    "params",
    "epsilon",
    "delta",
    "rows",
    "charge",
    *(f"{m}_{k}" for m in MODELS for k in METRICS),
    *(f"{m}_s" for m in MODELS),
    "seconds",
]


def _label(row: Mapping[str, Any]) -> str:
    params = json.loads(row["params"]) if row["params"] else {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    return f"{row['mechanism']} ({shown})" if shown else str(row["mechanism"])


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (dataset, configuration): mean and spread of every metric over repeats."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((str(r["dataset"]), _label(r)), []).append(r)
    out = []
    for (dataset, label), members in groups.items():
        entry: dict[str, Any] = {
            "dataset": dataset,
            "config": label,
            "mechanism": members[0]["mechanism"],
            "repeats": len(members),
            "epsilon": float(members[0]["epsilon"]),
            "delta": float(members[0]["delta"]),
            "seconds": float(np.mean([float(m["seconds"]) for m in members])),
        }
        for m in MODELS:
            for k in METRICS:
                values = [float(x[f"{m}_{k}"]) for x in members]
                entry[f"{m}_{k}"] = float(np.mean(values))
                entry[f"{m}_{k}_spread"] = float(np.max(values) - np.min(values))
                entry[f"{m}_{k}_range"] = (float(np.min(values)), float(np.max(values)))
        out.append(entry)
    return out


def write_outputs(out: Path, rows: list[dict[str, Any]], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise(rows)
    datasets = list(dict.fromkeys(s["dataset"] for s in summary))
    lines = [
        "# Tabular study: ClustMix beside DPMix, DP-CDA and the baselines",
        "",
        f"Made by: `{command}`",
        "",
        *[line for line in (__doc__ or "").splitlines()[5:22]],
        "",
        "Cells: mean over the repeats, (spread max − min) when there is more than one.",
        "",
    ]

    def cell(s: Mapping[str, Any], key: str) -> str:
        text = f"{s[key]:.3f}"
        if s["repeats"] > 1:
            text += f" ({s[key + '_spread']:.2f})"
        return text

    for dataset in datasets:
        mine = [s for s in summary if s["dataset"] == dataset]
        eps = sorted({s["epsilon"] for s in mine if np.isfinite(s["epsilon"])})
        delta = max(s["delta"] for s in mine)
        lines += [
            f"## {dataset} (ε = {', '.join(f'{e:g}' for e in eps)}, δ = {delta:.3g})",
            "",
            "| configuration | repeats | logistic accuracy | logistic AUC | HGB accuracy | "
            "HGB AUC | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in mine:
            lines.append(
                f"| {s['config']} | {s['repeats']} | {cell(s, 'logistic_accuracy')} | "
                f"{cell(s, 'logistic_auc')} | {cell(s, 'hgb_accuracy')} | "
                f"{cell(s, 'hgb_auc')} | {s['seconds']:.1f} |"
            )
        lines.append("")
    (out / "tabular.md").write_text("\n".join(lines))

    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        mine = [s for s in summary if s["dataset"] == dataset]
        ypos = np.arange(len(mine))
        for offset, model, colour in ((-0.2, "logistic", "tab:blue"), (0.2, "hgb", "tab:orange")):
            ax.barh(
                ypos + offset,
                [s[f"{model}_auc"] for s in mine],
                height=0.4,
                # The range over the repeats, around the mean bar.
                xerr=[
                    [s[f"{model}_auc"] - s[f"{model}_auc_range"][0] for s in mine],
                    [s[f"{model}_auc_range"][1] - s[f"{model}_auc"] for s in mine],
                ],
                color=colour,
                label=model,
            )
        ax.set_yticks(ypos, [s["config"] for s in mine], fontsize=6)
        ax.axvline(0.5, color="black", linewidth=0.5)
        ax.set_xlim(0.4, 1.0)
        ax.set_xlabel("ROC AUC on held-out real rows")
        ax.set_title(dataset, fontsize=9)
        ax.invert_yaxis()
        ax.legend(loc="lower right", fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "tabular.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=sorted({m for m, _, _ in CONFIGS}),
        help="configurations of these mechanisms only",
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, wine only")
    parser.add_argument(
        "--replot", action="store_true", help="only rewrite the table and plot from OUT's CSV"
    )
    args = parser.parse_args()
    if args.replot:
        with (args.out / "tabular.csv").open() as handle:
            kept = list(csv.DictReader(handle))
        write_outputs(args.out, kept, "python bench/tabular.py --out docs/results")
        return
    if args.quick:
        args.repeats, args.datasets = 1, ["wine"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with (args.out / "tabular.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()

        def keep(row: dict[str, Any]) -> None:
            print(json.dumps(row), flush=True)
            writer.writerow(row)
            handle.flush()
            rows.append(row)

        for dataset in args.datasets:
            X, y, documented = DATASETS[dataset]()
            X_train, X_test, y_train, y_test = split(X, y)
            parsed = parse(dataset, X_train, y_train, declared_bounds(X, documented))
            delta = 1.0 / parsed.n_rows
            keep(non_private(dataset, parsed, X_test, y_test))
            for mechanism, sweep, extra in CONFIGS:
                if mechanism not in args.mechanisms:
                    continue
                for _ in range(args.repeats):
                    keep(
                        run_one(
                            dataset,
                            parsed,
                            X_test,
                            y_test,
                            mechanism,
                            sweep,
                            extra,
                            args.epsilon,
                            delta,
                        )
                    )
    command = "python bench/tabular.py " + " ".join(sys.argv[1:])
    write_outputs(args.out, rows, command.strip())


if __name__ == "__main__":
    main()
