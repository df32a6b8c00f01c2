"""The recommendations table (issue 15.3): per (public dataset, ε, mechanism), the configuration
the studies measured best, written to dpcore/mechanisms/recommendations.json (shipped with the
package; read by ``dpcore.mechanisms.recommend`` for the preview's ``recommended``).

Usage:
    python bench/recommendations.py            # rewrite the JSON from the CSVs
    python bench/recommendations.py --check    # exit 1 when the JSON is stale against them

Sources: docs/results/tabular.csv (bench/tabular.py: one row per release; dataset, mechanism,
params — the explicitly set ones —, epsilon, delta, ``<model>_<metric>`` columns; ``n``, ``d``,
``classes`` when present, else the study's known shapes by dataset name) and
docs/results/sweet_spot.csv (bench/sweet_spot.py: MNIST, n = 10 000, 784 features, 10 classes,
image; one accuracy column per model family; the swept parameter in ``ell``) and
docs/results/records_study.csv (bench/records_study.py: each mechanism's defaults, or the
``--params`` of a run, at T = n, every model family): its MNIST rows supersede sweet_spot.csv's
rows of the mechanisms they measured, and its table rows count for the mechanisms tabular.csv
does not hold (MST; named ``<dataset>_n<private rows>``).
Rows of ε = ∞ (non-private) are references, not candidates; sweet_spot.csv's rows of a
mechanism whose served model changed since (``STALE_IN_SWEET_SPOT``) are left out.

A configuration is (mechanism, its params as the study sent them): the recorded params, plus
``n_samples = n`` where the mechanism has that parameter and the row does not set it (both
studies release one row per private row unless told otherwise: tabular's ``run_one``,
sweet_spot's hints). Its score is, per run, the mean over the models of the metric — balanced
accuracy when every row of that (dataset, ε) has it for every model, else accuracy — and then
the mean over repeated runs; the spread is max − min of the per-run score. Per (dataset, ε,
mechanism) the best score wins; ties (to 4 decimals) go to fewer params, then to the params'
JSON text. Output is sorted and rounded to 4 decimals, so it is the same on every machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import hints  # noqa: E402
from dpcore.mechanisms import registry  # noqa: E402
from dpcore.mechanisms.recommend import ROWS_PARAM, TABLE  # noqa: E402

TABULAR = Path("docs/results/tabular.csv")
SWEET_SPOT = Path("docs/results/sweet_spot.csv")
RECORDS = Path("docs/results/records_study.csv")
# bench/records_study.py's config "cheap" for DPGM (bench/tabular.py's DPGM_CHEAP, not
# imported: it loads the service's parser; a unit test keeps the two equal).
DPGM_CHEAP = {"hidden": 64, "epochs": 5.0}
COMMAND = "python bench/recommendations.py"
MNIST_DELTA = 1e-5  # bench/mnist.py's DELTA (not imported: it loads the service's parser)

# (n private rows, features, classes, image) of each study's datasets, for CSVs without the
# n/d/classes columns: bench/tabular.py splits 70 % private (sklearn's sizes × 0.7).
KNOWN: dict[str, tuple[int, int, int, bool]] = {
    "breast_cancer": (398, 30, 2, False),
    "digits": (1257, 64, 10, False),
    "wine": (124, 13, 3, False),
    "make_classification": (35_000, 20, 2, False),
    "mnist": (10_000, 784, 10, True),
}
METRICS = ("balanced_accuracy", "accuracy", "auc")  # longest first: suffix matching
DIGITS = 4


def _shape(dataset: str, row: Mapping[str, str]) -> tuple[int, int, int, bool]:
    """(n, d, classes, image): the row's columns where present, else the dataset's known
    shape; a make_classification variant may carry ``_n<N>``/``_d<D>`` in its name."""
    known = KNOWN.get(dataset)
    named = re.match(r"^(?P<base>[a-z_]+?)(?:_n(?P<n>\d+))?(?:_d(?P<d>\d+))?$", dataset)
    if known is None and named is not None:
        known = KNOWN.get(named["base"])
    if known is None and not all(row.get(c) for c in ("n", "d", "classes")):
        raise SystemExit(f"{dataset}: no n/d/classes columns and no known shape")
    n, d, classes, image = known or (0, 0, 0, False)
    if named is not None and named["n"]:
        n = int(named["n"])
    if named is not None and named["d"]:
        d = int(named["d"])
    if row.get("n"):
        n = int(float(row["n"]))
    if row.get("d"):
        d = int(float(row["d"]))
    if row.get("classes"):
        classes = int(float(row["classes"]))
    if row.get("image"):
        image = row["image"].strip().lower() in ("1", "true", "yes")
    return n, d, classes, image


def _metric_columns(fields: Iterable[str]) -> dict[tuple[str, str], str]:
    """{(model, metric): column} of tabular's ``<model>_<metric>`` columns."""
    out = {}
    for column in fields:
        for metric in METRICS:
            if column.endswith("_" + metric) and len(column) > len(metric) + 1:
                out[(column[: -len(metric) - 1], metric)] = column
                break
    return out


def _value(row: Mapping[str, str], column: str) -> float | None:
    text = (row.get(column) or "").strip()
    return float(text) if text else None


# Mechanisms whose sweet_spot.csv rows no longer describe what they serve: ClustMix's rows were
# all measured with model means, before model gaussian became its default (measured in
# docs/results/moment_model.md: every family of that table scores higher with it). Left out
# whether or not the records study measured them; every mechanism the records study measured
# on MNIST is left out of sweet_spot.csv too (``made``).
STALE_IN_SWEET_SPOT = frozenset({"clustmix"})


def _with_rows(mechanism: str, params: dict[str, Any], n: int) -> dict[str, Any]:
    """The params as the study sent them: ``n_samples = n`` unless the row sets it."""
    try:
        fields = registry.get(mechanism).params.model_fields
    except ValueError:
        return params
    if ROWS_PARAM in fields and ROWS_PARAM not in params:
        return {**params, ROWS_PARAM: n}
    return params


def tabular_runs(path: Path) -> list[dict[str, Any]]:
    """One run per private release of tabular.csv: its key, params and (model, metric)
    values."""
    with path.open() as handle:
        reader = csv.DictReader(handle)
        columns = _metric_columns(reader.fieldnames or ())
        runs = []
        for row in reader:
            epsilon = float(row["epsilon"])
            if not math.isfinite(epsilon):
                continue
            if (row.get("note") or "").strip():
                continue  # not run (refused, or left out): no figures to rank
            n, d, classes, image = _shape(row["dataset"], row)
            params = json.loads(row["params"]) if row.get("params") else {}
            if row.get("config") == "defaults":
                # The shape defaults as resolved for that table: recommended as "the defaults",
                # so a request of another shape gets its own (clip_norm, ℓ, min_class_size).
                params = {}
            runs.append(
                {
                    "dataset": row["dataset"],
                    "shape": (n, d, classes, image),
                    "epsilon": epsilon,
                    "delta": float(row["delta"]),
                    "mechanism": row["mechanism"],
                    "params": _with_rows(row["mechanism"], params, n),
                    "values": {
                        k: v for k, c in columns.items() if (v := _value(row, c)) is not None
                    },
                    "source": str(path),
                }
            )
    return runs


def sweet_spot_runs(path: Path) -> list[dict[str, Any]]:
    """One run per row of sweet_spot.csv (MNIST): the swept parameter from ``ell``, the
    recorded extra params, one accuracy per model family."""
    meta = {"mechanism", "epsilon", "ell", "params", "sigma_x", "charge", "seconds"}
    n, d, classes, image = KNOWN["mnist"]
    with path.open() as handle:
        reader = csv.DictReader(handle)
        families = [f for f in reader.fieldnames or () if f not in meta and not f.endswith("_s")]
        runs = []
        for row in reader:
            mechanism = row["mechanism"]
            if mechanism in STALE_IN_SWEET_SPOT:
                continue
            params: dict[str, Any] = json.loads(row["params"]) if row.get("params") else {}
            if row.get("ell"):
                sweep = hints.of(mechanism).sweep
                if sweep is None:
                    raise SystemExit(f"{path}: {mechanism} has an ell but no sweep parameter")
                params = {sweep: int(row["ell"]), **params}
            runs.append(
                {
                    "dataset": "mnist",
                    "shape": (n, d, classes, image),
                    "epsilon": float(row["epsilon"]),
                    "delta": MNIST_DELTA,
                    "mechanism": mechanism,
                    "params": _with_rows(mechanism, params, n),
                    "values": {
                        (f, "accuracy"): v for f in families if (v := _value(row, f)) is not None
                    },
                    "source": str(path),
                }
            )
    return runs


def records_runs(path: Path, table_mechanisms: Iterable[str] = ()) -> list[dict[str, Any]]:
    """One run per release of records_study.csv (bench/records_study.py: T = n, one accuracy
    column per model family, params in the config column): every MNIST release, and the
    tables' releases of ``table_mechanisms`` only (the mechanisms tabular.csv, whose sweep
    measures more than the defaults, does not hold). A table's run is named
    ``<dataset>_n<rows>`` (its private rows: the study's own split), so its (dataset, ε) group,
    which picks the metric, is its own."""
    meta = {"dataset", "mechanism", "config", "epsilon", "repeat", "charge", "rows"}
    meta |= {"distinct", "in_domain", "worst", "seconds", "note"}
    tables = set(table_mechanisms)
    with path.open() as handle:
        reader = csv.DictReader(handle)
        families = [f for f in reader.fieldnames or () if f not in meta]
        runs = []
        for row in reader:
            epsilon = float(row["epsilon"])
            if not math.isfinite(epsilon) or (row.get("note") or "").strip():
                continue  # a reference, or refused: no figures to rank
            if row["dataset"] == "mnist":
                dataset = "mnist"
                n, d, classes, image = KNOWN["mnist"]
                delta = MNIST_DELTA
            elif row["mechanism"] in tables and row["dataset"] in KNOWN:
                n = int(float(row["rows"]))
                dataset = f"{row['dataset']}_n{n}"
                _, d, classes, image = KNOWN[row["dataset"]]
                delta = 1.0 / n**2  # the study's δ for tables
            else:
                continue
            config = row.get("config") or "defaults"
            if config == "cheap":
                params = dict(DPGM_CHEAP)
            elif config.startswith("{"):
                params = json.loads(config)
            else:
                params = {}
            runs.append(
                {
                    "dataset": dataset,
                    "shape": (n, d, classes, image),
                    "epsilon": epsilon,
                    "delta": delta,
                    "mechanism": row["mechanism"],
                    "params": _with_rows(row["mechanism"], params, n),
                    "values": {
                        (f, "accuracy"): v for f in families if (v := _value(row, f)) is not None
                    },
                    "source": str(path),
                }
            )
    return runs


def _round(x: float) -> float:
    return round(float(x), DIGITS)


def build(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_problem: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_problem[(run["dataset"], run["epsilon"])].append(run)
    entries = []
    for (dataset, epsilon), members in sorted(by_problem.items()):
        # One metric and one model set per (dataset, ε), so every configuration competes on
        # the same figure.
        common = set.intersection(*(set(r["values"]) for r in members))
        metric = "balanced_accuracy"
        models = sorted(m for m, k in common if k == metric)
        if not models:
            metric = "accuracy"
            models = sorted(m for m, k in common if k == metric)
        if not models:
            raise SystemExit(f"{dataset} ε={epsilon}: no model has accuracy in every row")
        configs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for run in members:
            configs[(run["mechanism"], json.dumps(run["params"], sort_keys=True))].append(run)
        best: dict[str, tuple[tuple[float, int, str], dict[str, Any]]] = {}
        counted: dict[str, int] = defaultdict(int)
        for (mechanism, text), group in sorted(configs.items()):
            scores = [sum(r["values"][(m, metric)] for m in models) / len(models) for r in group]
            score = sum(scores) / len(scores)
            params = json.loads(text)
            key = (-_round(score), len(params), text)
            counted[mechanism] += 1
            all_keys = sorted(set.intersection(*(set(r["values"]) for r in group)))
            n, d, classes, image = group[0]["shape"]
            entry = {
                "dataset": dataset,
                "n": n,
                "d": d,
                "classes": classes,
                "image": image,
                "epsilon": epsilon,
                "delta": float(f"{group[0]['delta']:.6g}"),
                "mechanism": mechanism,
                "params": params,
                "metric": metric,
                "models": models,
                "score": _round(score),
                "spread": _round(max(scores) - min(scores)),
                "repeats": len(group),
                "metrics": {
                    f"{m}_{k}": _round(sum(r["values"][(m, k)] for r in group) / len(group))
                    for m, k in all_keys
                },
                "source": group[0]["source"],
            }
            if mechanism not in best or key < best[mechanism][0]:
                best[mechanism] = (key, entry)
        for mechanism, (_, entry) in sorted(best.items()):
            entries.append({**entry, "candidates": counted[mechanism]})
    return {
        "about": "Per (public dataset, ε, mechanism): the configuration the studies measured "
        "best (mean over models of the metric; ties to fewer params). Read by "
        "dpcore.mechanisms.recommend; rule and sources in bench/recommendations.py.",
        "made_by": COMMAND,
        "sources": sorted({r["source"] for r in runs}),
        "entries": entries,
    }


def render(table: Mapping[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def made(root: Path = ROOT, sources: Iterable[Path] = (TABULAR, SWEET_SPOT, RECORDS)) -> str:
    """The table's text from the CSVs under ``root`` (paths recorded relative to it). The
    records study's MNIST releases supersede sweet_spot.csv's rows of the same mechanisms:
    they are the defaults at T = n, scored by every family; its table releases count for the
    mechanisms tabular.csv does not measure (MST)."""
    runs: list[dict[str, Any]] = []
    records = [s for s in sources if s.name.startswith("records_study")]
    for source in sources:
        path = root / source
        if source.name.startswith("sweet_spot"):
            runs += [{**r, "source": str(source)} for r in sweet_spot_runs(path)]
        elif not source.name.startswith("records_study"):
            runs += [{**r, "source": str(source)} for r in tabular_runs(path)]
    # The records study's table releases count for the mechanisms the tabular study lacks.
    on_tables = {r["mechanism"] for r in runs if r["dataset"] != "mnist"}
    served = {s.name for s in registry.served()}
    for source in records:
        for run in records_runs(root / source, served - on_tables):
            runs.append({**run, "source": str(source)})
    measured = {r["mechanism"] for r in runs if r["source"].endswith("records_study.csv")}
    runs = [
        r
        for r in runs
        if not (r["source"].endswith("sweet_spot.csv") and r["mechanism"] in measured)
    ]
    return render(build(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="where docs/results lies")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--check", action="store_true", help="fail when --out is stale")
    args = parser.parse_args(argv)
    text = made(args.root)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale against the studies' CSVs: run `{COMMAND}`")
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(json.loads(text)['entries'])} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
