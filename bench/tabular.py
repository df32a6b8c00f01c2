"""Tabular utility study: every served mechanism at several ε on five tables, logistic
regression, gradient-boosted trees and a random forest trained on the release, tested on
held-out real rows.

Usage:
    OMP_NUM_THREADS=1 python bench/tabular.py --out docs/results [--epsilons 1 10]
        [--repeats 2] [--datasets ...] [--mechanisms ...] [--param KEY=JSON ...]
        [--sweep KEY=JSON,JSON,... ...] [--quick] [--replot]

Data: bench/tabular_data.py (breast-cancer, wine, digits as NPZ uploads; make_classification,
n = 50 000, as a CSV with two declared categorical columns and 5 % missing values, and
patients, n = 4 000, a hospital-style CSV with two categorical columns, integer columns and
gaps under both missing-value policies, both parsed by the service's parser; 70 % private /
30 % held-out test, stratified, seed 0).

Releases: every mechanism the service runs (``registry.served()``), each made by
``bench.sweet_spot.make_release`` — the service's admission resolution of parameters (shape
defaults, checks), the ``tight`` accountant calibrated to ε at δ = 1/n² (n the private rows),
the mechanism's own generator, the worker's post-processing and categorical decoding. Per
mechanism: a ``defaults`` configuration (no parameter given: every shape default resolved as
the service resolves it) and a few ``grid`` ones (its sweep knob at other values; random
projection at projection_dim 10). DPGM is a GPU-queue network trainer: its service defaults
(hidden 200, 20 epochs) take minutes per release on one core, so it runs once in its
cheapest sensible settings (``DPGM_CHEAP``: hidden 64, 5 epochs, config ``cheap``). A grid
configuration whose resolved params equal the defaults' is not run twice (the log says so);
one the service would refuse (a check, a calibration that fails) gets a row whose ``note``
says why and blank metrics.

``--param KEY=JSON`` sets KEY in every configuration of every mechanism whose params model has
that field; ``--sweep KEY=V1,V2,...`` makes KEY a grid axis the same way (each configuration
of such a mechanism once per value; the others once), e.g. ``--sweep clip_norm=1,2,4``.

Models (``dpcore.evaluation.SKLEARN_MODELS``, the settings ``dprelease evaluate`` trains):
LogisticRegression, HistGradientBoosting and RandomForest trained as ``dprelease evaluate``
trains them:
exact labels as they are, class-mixture labels as per-class weighted rows
(``dpcore.evaluation.weighted_rows``), SGDRM's signed combinations by their argmax; features in
raw units scaled by the declared bounds (``model_scale``); tested on the held-out rows mapped
into the release's space with public facts (``dpcore.evaluation.preprocess_test``; declared
categorical blocks decoded to proportions like the release's). Metrics (``dpcore.evaluation``):
accuracy, balanced accuracy (mean recall over the test classes) and ROC AUC (binary: the
positive class; multi-class: macro one-vs-rest; a class absent from a release scores 0, a one-
class release is a constant: 0.5). The ``non-private`` rows (ε = ∞) train the same models on
the private rows themselves.

CSV columns (OUT/tabular.csv, one row per release, written as each finishes):
    dataset, n (private rows), d (encoded features), classes, image (features image-shaped),
    mechanism, params (JSON: the explicitly set params; ``defaults`` rows: the resolved shape
    defaults and any --param/--sweep value), config (defaults | grid | cheap | non-private),
    epsilon, delta, rows (released), charge (ε charged at δ),
    logistic_accuracy, logistic_balanced_accuracy, logistic_auc,
    hgb_accuracy, hgb_balanced_accuracy, hgb_auc,
    logistic_s, hgb_s (training seconds), seconds (release + both models), note (why a
    configuration did not run; empty otherwise).
OUT/tabular.md and OUT/tabular.png (bench/tabular_report.py) are written at the end.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import hints  # noqa: E402
from bench.sweet_spot import make_release, resolved  # noqa: E402
from bench.tabular_data import DATASETS, Table  # noqa: E402
from bench.tabular_report import write_outputs  # noqa: E402
from dpcore.categorical import category_proportions  # noqa: E402
from dpcore.evaluation import (  # noqa: E402
    SKLEARN_MODELS,
    Release,
    balanced_accuracy,
    class_indices,
    model_scale,
    preprocess_test,
    roc_auc,
    weighted_rows,
)
from dpcore.mechanisms import registry  # noqa: E402
from dpcore.preprocessing import scale_to_unit  # noqa: E402

MODELS = ("logistic", "hgb", "random_forest")
METRICS = ("accuracy", "balanced_accuracy", "auc")
EPSILONS = (1.0, 10.0)
FIELDS = [
    "dataset",
    "n",
    "d",
    "classes",
    "image",
    "mechanism",
    "params",
    "config",
    "epsilon",
    "delta",
    "rows",
    "charge",
    *(f"{m}_{k}" for m in MODELS for k in METRICS),
    *(f"{m}_s" for m in MODELS),
    "seconds",
    "note",
]
# The sweep knob's grid values beside the defaults (dpmix/dpcda/sgdrm ℓ; clustmix clusters per
# class, whose default is 16); mechanisms without a knob run their defaults (and GRID_EXTRA).
GRID = {"mixture_degree": (4, 64), "mixture_width": (4, 64), "clusters_per_class": (1, 4)}
GRID_EXTRA: dict[str, tuple[dict[str, Any], ...]] = {
    "random_projection": ({"projection_dim": 10},),
}
# DPGM's cheapest sensible settings (see the module docstring): a smaller network, fewer
# epochs; everything else its defaults.
DPGM_CHEAP = {"hidden": 64, "epochs": 5.0}
# Grid configurations left out above this many private rows, per mechanism, to keep the study
# within its time (~35 min on one core at --repeats 2): SGDRM draws an n × T matrix of secure
# Bernoulli inclusions, 50–90 s per release at n = 35 000, T = n on one core. Its defaults
# configuration still runs; the grid rows say they were left out.
GRID_MAX_ROWS = {"sgdrm": 10_000}


@dataclass(frozen=True)
class Config:
    mechanism: str
    config: str  # defaults | grid | cheap
    request: dict[str, Any] = field(default_factory=dict)


def configs(
    mechanisms: Sequence[str],
    fixed: Mapping[str, Any],
    sweeps: Mapping[str, Sequence[Any]],
    grid: bool = True,
) -> list[Config]:
    """Every configuration of the study, registry order: defaults, then the grid; ``fixed``
    (--param) and each ``sweeps`` axis (--sweep) applied where the params model has the field."""
    out: list[Config] = []
    for spec in registry.served():
        if spec.name not in mechanisms:
            continue
        base: list[Config] = []
        if spec.name == "dpgm":
            base.append(Config("dpgm", "cheap", dict(DPGM_CHEAP)))
        else:
            base.append(Config(spec.name, "defaults"))
        sweep = hints.of(spec.name).sweep
        if grid and sweep in GRID:
            base += [Config(spec.name, "grid", {sweep: v}) for v in GRID[sweep]]
        if grid:
            base += [Config(spec.name, "grid", dict(e)) for e in GRID_EXTRA.get(spec.name, ())]
        fields = spec.params.model_fields
        mine = {k: v for k, v in fixed.items() if k in fields}
        axes = {k: list(v) for k, v in sweeps.items() if k in fields}
        for c in base:
            for values in itertools.product(*axes.values()):
                request = {**c.request, **mine, **dict(zip(axes, values, strict=True))}
                out.append(Config(c.mechanism, c.config, request))
    return out


def test_space(release: Release, X_test: np.ndarray) -> np.ndarray:
    """Held-out rows in the release's feature space, public facts only: the release's declared
    preprocessing, then its categorical blocks as proportions where the release decoded them."""
    Xt = preprocess_test(release, X_test)
    blocks = release.metadata.get("categorical_blocks")
    return category_proportions(Xt, blocks) if blocks else Xt


def scores(
    X: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    Xt: np.ndarray,
    yt: np.ndarray,
    Y: np.ndarray | None = None,
) -> dict[str, float]:
    """Each model trained on (X, hard labels) — or, given class-mixture labels ``Y``, on
    per-class weighted rows as ``dprelease evaluate`` trains (``weighted_rows``) — its metrics
    on (Xt, yt) and training seconds."""
    out: dict[str, float] = {}
    weighted = weighted_rows(X, Y) if Y is not None else None
    if weighted is not None:
        X, labels, weights = weighted
    present = np.unique(labels)
    for model in MODELS:
        start = time.perf_counter()
        proba = np.full((len(Xt), n_classes), 1.0 / n_classes)  # an empty release: no ranking
        if len(present) == 1:
            proba = np.zeros((len(Xt), n_classes))  # one class: every model predicts it
            proba[:, present[0]] = 1.0
        elif len(present) > 1:
            clf = SKLEARN_MODELS[model](0)
            if weighted is None:
                clf.fit(X, labels)
            else:
                clf.fit(X, labels, sample_weight=weights)
            # A class no released row carries scores 0 (it can neither be predicted nor ranked).
            proba = np.zeros((len(Xt), n_classes))
            proba[:, np.asarray(clf.classes_, dtype=int)] = clf.predict_proba(Xt)
        predicted = proba.argmax(axis=1)
        out[f"{model}_accuracy"] = float(np.mean(predicted == yt))
        out[f"{model}_balanced_accuracy"] = balanced_accuracy(yt, predicted)
        out[f"{model}_auc"] = roc_auc(yt, proba)
        out[f"{model}_s"] = round(time.perf_counter() - start, 3)
    return out


def shape_of(table: Table) -> dict[str, Any]:
    p = table.private
    return {
        "dataset": table.name,
        "n": p.n_rows,
        "d": p.n_features,
        "classes": len(p.classes),
        "image": table.image,
    }


def shown_params(config: Config, params: Any) -> str:
    """The row's params: those the request set, and for ``defaults`` rows the values the
    shape defaults resolved to."""
    spec = registry.get(config.mechanism)
    names = set(config.request)
    if config.config == "defaults":
        names |= {d.name for d in spec.admission.shape_defaults}
    values = params.model_dump() if params is not None else config.request
    return json.dumps({k: values.get(k) for k in sorted(names)})


def resolved_key(table: Table, config: Config) -> str | None:
    """The configuration's params as admission resolves them (None: refused), to tell two
    configurations that are one."""
    try:
        params = resolved(registry.get(config.mechanism), config.request, table.private)
    except ValueError:
        return None
    return json.dumps([config.mechanism, params.model_dump()], sort_keys=True, default=str)


def left_out(table: Table, config: Config) -> str:
    """Why the study leaves this configuration out on this table ("" when it runs it)."""
    limit = GRID_MAX_ROWS.get(config.mechanism)
    if config.config == "grid" and limit is not None and table.private.n_rows > limit:
        return (
            f"not run: {config.mechanism}'s grid is left out above n = {limit} rows "
            "(release cost grows as n × n_samples; bench/tabular.py GRID_MAX_ROWS)"
        )
    return ""


def run_one(table: Table, config: Config, epsilon: float, delta: float) -> dict[str, Any]:
    start = time.perf_counter()
    spec = registry.get(config.mechanism)
    row: dict[str, Any] = {
        **shape_of(table),
        "mechanism": config.mechanism,
        "config": config.config,
        "epsilon": epsilon,
        "delta": delta,
        "note": left_out(table, config),
    }
    if row["note"]:
        row["params"] = shown_params(config, None)
        row["seconds"] = 0.0
        return row
    try:
        params = resolved(spec, config.request, table.private)
        row["params"] = shown_params(config, params)
        release, event = make_release(
            config.mechanism, config.request, table.private, epsilon, delta
        )
    except (ValueError, ArithmeticError) as exc:
        # What the service would answer 422 for (checks, calibration): a row that says why.
        row.setdefault("params", shown_params(config, None))
        row["note"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        row["seconds"] = round(time.perf_counter() - start, 1)
        return row
    row["rows"] = len(release.X)
    row["charge"] = event.epsilon(delta)
    labels = release.Y.argmax(axis=1) if len(release.X) else np.zeros(0, dtype=np.int64)
    # Models see what `dprelease evaluate` feeds them: the release as served (raw units) and
    # the held-out rows through the same public transform, both scaled per column by the
    # declared bounds (dpcore.evaluation.model_scale).
    scaled = model_scale(release.metadata)
    Xt = scaled(test_space(release, table.X_test))
    yt = class_indices(release, table.y_test)
    soft = registry.get(config.mechanism).soft_labels
    Y = release.Y if soft and len(release.X) else None
    row.update(scores(scaled(release.X), labels, len(table.private.classes), Xt, yt, Y))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def non_private(table: Table) -> dict[str, Any]:
    """The same models on the private rows (ε = ∞), each column scaled to [0, 1] by its
    declared bounds (what an analyst would feed them; no row clipping)."""
    start = time.perf_counter()
    p = table.private
    lookup = {str(c): i for i, c in enumerate(p.classes)}
    yt = np.array([lookup[str(v)] for v in table.y_test])
    X = scale_to_unit(p.X, p.lo, p.hi)
    Xt = scale_to_unit(table.X_test, p.lo, p.hi)
    if p.categorical_blocks:
        X = category_proportions(X, p.categorical_blocks)
        Xt = category_proportions(Xt, p.categorical_blocks)
    row: dict[str, Any] = {
        **shape_of(table),
        "mechanism": "non-private",
        "params": "{}",
        "config": "non-private",
        "epsilon": float("inf"),
        "delta": 0.0,
        "rows": p.n_rows,
        "charge": float("inf"),
        "note": "",
    }
    row.update(scores(X, p.labels, len(p.classes), Xt, yt))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _value(text: str) -> Any:
    """A --param/--sweep value: JSON where it parses (1, 2.5, "x", true), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: Sequence[str], flag: str) -> Iterator[tuple[str, str]]:
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} takes KEY=VALUE, got {item!r}")
        yield key, value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--mechanisms", nargs="+", default=[s.name for s in registry.served()])
    parser.add_argument("--param", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2")
    parser.add_argument("--no-grid", action="store_true", help="defaults configurations only")
    parser.add_argument(
        "--rows", type=int, default=None, help="make_classification's n (default 50 000)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="sanity run: wine and make_classification at n = 2000, ε = 1, defaults only, "
        "one repeat",
    )
    parser.add_argument(
        "--replot", action="store_true", help="only rewrite the table and plot from OUT's CSV"
    )
    args = parser.parse_args(argv)
    unknown = set(args.mechanisms) - {s.name for s in registry.served()}
    if unknown:
        parser.error(f"not served mechanisms: {sorted(unknown)}")
    if args.quick:
        args.datasets = [d for d in ("wine", "make_classification") if d in args.datasets]
        args.epsilons, args.repeats, args.no_grid = [1.0], 1, True
        args.rows = args.rows or 2000
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = "python bench/tabular.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.replot:
        with (args.out / "tabular.csv").open() as handle:
            write_outputs(args.out, list(csv.DictReader(handle)), command.strip(), __doc__ or "")
        return
    fixed = {k: _value(v) for k, v in _pairs(args.param, "--param")}
    sweeps = {k: [_value(x) for x in v.split(",")] for k, v in _pairs(args.sweep, "--sweep")}
    plan = configs(args.mechanisms, fixed, sweeps, grid=not args.no_grid)
    total = len(args.datasets) * (1 + len(plan) * len(args.epsilons) * args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    began, cpu = time.perf_counter(), time.process_time()
    with (args.out / "tabular.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()

        def keep(row: dict[str, Any]) -> None:
            writer.writerow(row)
            handle.flush()
            rows.append(row)
            elapsed = time.perf_counter() - began
            left = elapsed / len(rows) * (total - len(rows))
            metrics = (
                row["note"]
                or f"bal.acc logistic {row['logistic_balanced_accuracy']:.3f} "
                f"hgb {row['hgb_balanced_accuracy']:.3f}, AUC logistic "
                f"{row['logistic_auc']:.3f} hgb {row['hgb_auc']:.3f}"
            )
            print(
                f"[{len(rows)}/{total}] {row['dataset']} {row['mechanism']} {row['config']} "
                f"{row['params']} ε={row['epsilon']:g}: {metrics} ({row['seconds']} s; "
                f"elapsed {elapsed:.0f} s, ~{left:.0f} s left)",
                file=sys.stderr,
                flush=True,
            )

        for dataset in args.datasets:
            table = DATASETS[dataset](args.rows)
            delta = 1.0 / table.private.n_rows**2
            keep(non_private(table))
            for epsilon in args.epsilons:
                seen: set[str] = set()
                for config in plan:
                    key = resolved_key(table, config)
                    if key is not None and key in seen:
                        # The shape defaults already resolve to this configuration.
                        total -= args.repeats
                        print(
                            f"{dataset} {config.mechanism} {config.request} ε={epsilon:g}: "
                            "resolves to a configuration already run, not run twice",
                            file=sys.stderr,
                        )
                        continue
                    if key is not None:
                        seen.add(key)
                    if left_out(table, config):
                        total -= args.repeats - 1
                        keep(run_one(table, config, epsilon, delta))  # one row that says so
                        continue
                    for _ in range(args.repeats):
                        keep(run_one(table, config, epsilon, delta))
    write_outputs(args.out, rows, command.strip(), __doc__ or "")
    # CPU seconds beside wall seconds: on a shared machine the first is what one free core
    # would take.
    print(
        f"done: {len(rows)} rows in {time.perf_counter() - began:.0f} s "
        f"({time.process_time() - cpu:.0f} CPU s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
