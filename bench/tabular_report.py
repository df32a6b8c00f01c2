"""The tabular study's outputs (bench/tabular.py): OUT/tabular.md — a summary of which
mechanism wins where, then per dataset one table per ε with the mean and spread over repeats —
and OUT/tabular.png — per dataset and model, balanced accuracy vs ε of each mechanism's
defaults configuration beside the non-private line. Reads the rows as written (or as read back
from the CSV: every value text), so ``--replot`` redraws a finished study."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("logistic", "hgb", "random_forest")
MODEL_NAMES = {"logistic": "logistic", "hgb": "HGB", "random_forest": "random forest"}
METRICS = ("balanced_accuracy", "auc", "accuracy")
METRIC_NAMES = {"balanced_accuracy": "bal. acc.", "auc": "AUC", "accuracy": "acc."}
# The configurations the summary and the plot take per mechanism: what a user gets without
# choosing (DPGM's cheap settings stand in for its defaults, see bench/tabular.py).
DEFAULT_CONFIGS = ("defaults", "cheap")


def _num(value: Any) -> float:
    """A metric as a float; NaN where the row has none (a refused configuration)."""
    if value is None or value == "":
        return math.nan
    return float(value)


def _params(row: Mapping[str, Any]) -> str:
    params = json.loads(row.get("params") or "{}")
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (dataset, mechanism, config, params, ε): mean and spread (max − min) of
    every metric over the repeats that ran; ``note`` from a refused one."""
    groups: dict[tuple[str, str, str, str, float], list[Mapping[str, Any]]] = {}
    for r in rows:
        key = (
            str(r["dataset"]),
            str(r["mechanism"]),
            str(r["config"]),
            _params(r),
            float(r["epsilon"]),
        )
        groups.setdefault(key, []).append(r)
    out = []
    for (dataset, mechanism, config, params, epsilon), members in groups.items():
        ran = [m for m in members if not m.get("note")]
        entry: dict[str, Any] = {
            "dataset": dataset,
            "mechanism": mechanism,
            "config": config,
            "params": params,
            "epsilon": epsilon,
            "shape": members[0],
            "repeats": len(ran),
            "note": next((str(m["note"]) for m in members if m.get("note")), ""),
            "rows": np.mean([_num(m["rows"]) for m in ran]) if ran else math.nan,
            "charge": max((_num(m["charge"]) for m in ran), default=math.nan),
            "seconds": np.mean([_num(m["seconds"]) for m in members]),
        }
        for model in MODELS:
            for metric in METRICS:
                name = f"{model}_{metric}"
                values = [_num(m.get(name)) for m in ran]
                entry[name] = float(np.mean(values)) if values else math.nan
                entry[f"{name}_lo"] = min(values, default=math.nan)
                entry[f"{name}_hi"] = max(values, default=math.nan)
        out.append(entry)
    return out


def _cell(s: Mapping[str, Any], key: str) -> str:
    if math.isnan(s[key]):
        return "—"
    text = f"{s[key]:.3f}"
    if s["repeats"] > 1:
        text += f" ± {(s[key + '_hi'] - s[key + '_lo']) / 2:.3f}"
    return text


def _winner(entries: Sequence[Mapping[str, Any]], key: str) -> str:
    ran = [s for s in entries if not math.isnan(s[key])]
    if not ran:
        return "—"
    best = max(ran, key=lambda s: s[key])
    label = best["mechanism"] if best["config"] in DEFAULT_CONFIGS else _label(best)
    # Balanced accuracy's chance level is 1/classes: a "best" there learnt nothing.
    chance = 1 / int(best["shape"]["classes"])
    flag = " (chance)" if key.endswith("balanced_accuracy") and best[key] < chance + 0.02 else ""
    return f"{label} {best[key]:.3f}{flag}"


def _label(s: Mapping[str, Any]) -> str:
    return f"{s['mechanism']} ({s['params']})" if s["params"] else str(s["mechanism"])


def markdown(summary: Sequence[Mapping[str, Any]], command: str, setup: str) -> str:
    datasets = list(dict.fromkeys(s["dataset"] for s in summary))
    lines = [
        "# Tabular utility study: every mechanism on breast-cancer, wine, digits and two mixed "
        "tables",
        "",
        f"Made by: `{command}`",
        "",
        setup,
        "",
        "Cells: mean over the repeats ± half the spread (max − min) when there is more than "
        "one; — : the configuration did not run (the note says why). params: what the request "
        "set; for `defaults` rows, the values the service's shape defaults resolved to.",
        "",
        "## Which mechanism wins where",
        "",
        "Best balanced accuracy per dataset and ε: among the `defaults` configurations (what "
        "a user gets without choosing; DPGM's `cheap` one), and among every configuration; "
        "(chance): within 0.02 of 1/classes, the best learnt nothing.",
        "",
        "| dataset | ε | logistic, defaults | HGB, defaults | logistic, any | HGB, any | "
        "non-private logistic / HGB |",
        "|---|---|---|---|---|---|---|",
    ]
    for dataset in datasets:
        mine = [s for s in summary if s["dataset"] == dataset]
        reference = next((s for s in mine if s["mechanism"] == "non-private"), None)
        ref = (
            f"{reference['logistic_balanced_accuracy']:.3f} / "
            f"{reference['hgb_balanced_accuracy']:.3f}"
            if reference
            else "—"
        )
        for epsilon in sorted({s["epsilon"] for s in mine if math.isfinite(s["epsilon"])}):
            at = [s for s in mine if s["epsilon"] == epsilon]
            defaults = [s for s in at if s["config"] in DEFAULT_CONFIGS]
            cells = [
                _winner(defaults, "logistic_balanced_accuracy"),
                _winner(defaults, "hgb_balanced_accuracy"),
                _winner(at, "logistic_balanced_accuracy"),
                _winner(at, "hgb_balanced_accuracy"),
            ]
            lines.append(f"| {dataset} | {epsilon:g} | " + " | ".join(cells) + f" | {ref} |")
    lines.append("")
    lines += _auc_tables(summary, datasets)
    columns = [(m, k) for m in MODELS for k in METRICS]
    header = " | ".join(f"{MODEL_NAMES[m]} {METRIC_NAMES[k]}" for m, k in columns)
    for dataset in datasets:
        mine = [s for s in summary if s["dataset"] == dataset]
        shape = mine[0]["shape"]
        private = [s for s in mine if math.isfinite(s["epsilon"])]
        delta = _num(private[0]["shape"]["delta"]) if private else math.nan
        lines += [
            f"## {dataset} (n = {shape['n']}, d = {shape['d']}, {shape['classes']} classes, "
            f"δ = 1/n² = {delta:.3g})",
            "",
        ]
        references = [s for s in mine if s["mechanism"] == "non-private"]
        for epsilon in sorted({s["epsilon"] for s in private}):
            lines += [
                f"### ε = {epsilon:g}",
                "",
                f"| mechanism | config | params | rows | charged ε | {header} | seconds | note |",
                "|---|---|---|---|---|" + "---|" * len(columns) + "---|---|",
            ]
            for s in [*references, *(s for s in private if s["epsilon"] == epsilon)]:
                charge = "∞" if math.isinf(s["charge"]) else f"{s['charge']:.4f}"
                rows = "—" if math.isnan(s["rows"]) else f"{s['rows']:.0f}"
                metrics = " | ".join(_cell(s, f"{m}_{k}") for m, k in columns)
                lines.append(
                    f"| {s['mechanism']} | {s['config']} | {s['params']} | {rows} | {charge} | "
                    f"{metrics} | {s['seconds']:.1f} | {s['note']} |"
                )
            lines.append("")
    return "\n".join(lines)


def _auc_tables(summary: Sequence[Mapping[str, Any]], datasets: Sequence[str]) -> list[str]:
    """Per dataset, every mechanism's defaults at each ε: ROC AUC of each model on the
    held-out real rows, the best mechanism per ε in bold (by the mean over the models)."""
    epsilons = sorted({s["epsilon"] for s in summary if math.isfinite(s["epsilon"])})
    names = " / ".join(MODEL_NAMES[m] for m in MODELS)
    lines = [
        "## Every mechanism's defaults: ROC AUC on held-out real rows",
        "",
        f"Cells: {names} AUC (mean over the repeats) of the mechanism's `defaults` "
        "configuration (DPGM's `cheap`); bold: the highest mean of the three at that ε. "
        "Multi-class AUC is macro one-vs-rest.",
        "",
    ]
    for dataset in datasets:
        mine = [s for s in summary if s["dataset"] == dataset]
        defaults = [s for s in mine if s["config"] in DEFAULT_CONFIGS]
        mechanisms = list(dict.fromkeys(s["mechanism"] for s in defaults))
        reference = next((s for s in mine if s["mechanism"] == "non-private"), None)
        lines += [
            f"### {dataset}",
            "",
            "| mechanism | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |",
            "|---|" + "---|" * len(epsilons),
        ]
        best = {}
        for epsilon in epsilons:
            at = [s for s in defaults if s["epsilon"] == epsilon]
            scored = [(float(np.nanmean([s[f"{m}_auc"] for m in MODELS])), s) for s in at]
            scored = [(v, s) for v, s in scored if not math.isnan(v)]
            best[epsilon] = max(scored, key=lambda x: x[0])[1]["mechanism"] if scored else None
        for mechanism in mechanisms:
            cells = []
            for epsilon in epsilons:
                entry = next(
                    (
                        s
                        for s in defaults
                        if s["mechanism"] == mechanism and s["epsilon"] == epsilon
                    ),
                    None,
                )
                if entry is None or all(math.isnan(entry[f"{m}_auc"]) for m in MODELS):
                    cells.append("—")
                    continue
                text = " / ".join(
                    "—" if math.isnan(entry[f"{m}_auc"]) else f"{entry[f'{m}_auc']:.3f}"
                    for m in MODELS
                )
                cells.append(f"**{text}**" if best[epsilon] == mechanism else text)
            lines.append(f"| {mechanism} | " + " | ".join(cells) + " |")
        if reference is not None:
            text = " / ".join(f"{reference[f'{m}_auc']:.3f}" for m in MODELS)
            lines.append(
                "| non-private (the private rows) | " + " | ".join([text] * len(epsilons)) + " |"
            )
        lines.append("")
    return lines


def plot(summary: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(s["dataset"] for s in summary))
    fig, axes = plt.subplots(
        len(MODELS), len(datasets), figsize=(4.6 * len(datasets), 3.8 * len(MODELS)), squeeze=False
    )
    key_of = {m: f"{m}_balanced_accuracy" for m in MODELS}
    for col, dataset in enumerate(datasets):
        mine = [s for s in summary if s["dataset"] == dataset]
        series: dict[str, list[Mapping[str, Any]]] = {}
        for s in mine:
            if s["config"] in DEFAULT_CONFIGS:
                series.setdefault(f"{s['mechanism']}\n{s['params']}", []).append(s)
        per_mechanism = {k.split("\n")[0] for k in series}
        for row, model in enumerate(MODELS):
            ax = axes[row][col]
            key = key_of[model]
            for name, members in series.items():
                members = sorted(
                    (m for m in members if not math.isnan(m[key])), key=lambda m: m["epsilon"]
                )
                if not members:
                    continue
                mechanism, params = name.split("\n")
                several = sum(k.startswith(mechanism + "\n") for k in series) > 1
                label = f"{mechanism} ({params})" if several and params else mechanism
                eps = [m["epsilon"] for m in members]
                mean = np.array([m[key] for m in members])
                ax.errorbar(
                    eps,
                    mean,
                    yerr=[
                        mean - np.array([m[f"{key}_lo"] for m in members]),
                        np.array([m[f"{key}_hi"] for m in members]) - mean,
                    ],
                    marker="o",
                    capsize=2,
                    label=label,
                )
            for s in mine:
                if s["mechanism"] == "non-private" and not math.isnan(s[key]):
                    ax.axhline(s[key], color="black", linestyle="--", label="non-private")
            chance = 1 / int(mine[0]["shape"]["classes"])
            ax.axhline(chance, color="grey", linestyle=":", label="chance (1/classes)")
            ax.set_xscale("log")
            ax.set_xlabel("ε (δ = 1/n²)")
            ax.set_ylabel(f"{MODEL_NAMES[model]} balanced accuracy")
            ax.set_title(f"{dataset}: {MODEL_NAMES[model]}", fontsize=9)
            if per_mechanism:
                ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(out: Path, rows: Sequence[Mapping[str, Any]], command: str, doc: str) -> None:
    """The table and the plot; ``doc``: the study's docstring, whose setup part (from "Data:"
    to the CSV columns) heads the table."""
    summary = summarise(rows)
    setup = doc.split("CSV columns")[0].split("Data:", 1)[-1].strip()
    (out / "tabular.md").write_text(markdown(summary, command, "Data: " + setup) + "\n")
    plot(summary, out / "tabular.png")
