"""``dprelease evaluate``: what a release is worth, measured on real data (offline)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from dpcore.evaluation import (
    CLASSIFIERS,
    DEFAULT_CLASSIFIERS,
    POSTPROCESSING,
    evaluate,
    families_for,
    load_records,
    load_release_file,
)

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _line(name: str, row: dict[str, Any]) -> str:
    """One human-readable result line (stderr): the figures an analyst compares first."""
    auc = row["roc_auc"]
    auc_text = f"{auc:.3f}" if auc is not None else f"n/a ({row.get('roc_auc_reason')})"
    seconds = f"  {row['seconds']:.1f}s" if "seconds" in row else ""
    return (
        f"{name:<24} accuracy {row['accuracy']:.3f}  balanced {row['balanced_accuracy']:.3f}  "
        f"ROC AUC {auc_text}{seconds}"
    )


@click.command("evaluate")
@click.argument("release", type=_FILE)
@click.option(
    "--test",
    "test_file",
    type=_FILE,
    required=True,
    help="Real records, raw scale, same features as the dataset: NPZ with X and y, or CSV / "
    "Parquet with a label column (--label-column).",
)
@click.option(
    "--label-column",
    default=None,
    help="The label column of a CSV/Parquet --test or --reference file; default: the first "
    "of y, label, class, target found.",
)
@click.option(
    "--reference",
    "reference_file",
    type=_FILE,
    default=None,
    help="Real training records (same formats as --test): the same models trained on them give "
    "a non-private reference. Without it the report has none.",
)
@click.option(
    "--metadata",
    "metadata_file",
    type=_FILE,
    default=None,
    help="The release's metadata JSON (its metadata.json artifact). A CSV release carries "
    "none and needs it: its layout names the feature and label columns. (A CSV release made "
    "before layouts, with x_<feature> and y_<class> columns, reads without it: classes from "
    "the y_<class> columns, test rows used as given.)",
)
@click.option(
    "--array",
    "array_files",
    type=_FILE,
    multiple=True,
    help="A mechanism's public array that a CSV or Parquet release ships as a further file "
    "(its metadata's 'arrays' says which: random projection's projection.npy), repeatable; "
    "named by its file name without .npy. An NPZ release holds them inside.",
)
@click.option(
    "--classifier",
    "classifiers",
    type=click.Choice([*CLASSIFIERS, "all"]),
    multiple=True,
    help=f"Model family, repeatable; default {', '.join(DEFAULT_CLASSIFIERS)}. logistic, "
    "sklearn_mlp, hgb, random_forest, knn: scikit-learn's LogisticRegression, MLPClassifier, "
    "HistGradientBoostingClassifier, RandomForestClassifier and KNeighborsClassifier with "
    "default settings (class-mixture labels as per-class weighted rows, kNN by their argmax; "
    "exact labels as they are); linear: "
    "ridge on the label matrix; mlp, cnn: small torch networks (cnn: image-shaped data only, "
    "refused otherwise). 'all': every family that applies.",
)
@click.option(
    "--postprocess",
    type=click.Choice(POSTPROCESSING),
    default="none",
    show_default=True,
    help="Free post-processing before training (the release file is not changed).",
)
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def evaluate_command(
    release: Path,
    test_file: Path,
    label_column: str | None,
    reference_file: Path | None,
    metadata_file: Path | None,
    array_files: tuple[Path, ...],
    classifiers: tuple[str, ...],
    postprocess: str,
    epochs: int,
    seed: int,
) -> None:
    """Train classifiers on a RELEASE (NPZ, CSV or Parquet, as the service writes it) and
    report each one's accuracy, balanced accuracy and ROC AUC on real test data, beside a
    majority-class row (the release's most frequent class) and, with --reference, the same
    models trained on real records. Each result is printed on stderr as it finishes; the
    report is one JSON object on stdout. Costs no privacy: it only reads the release and your
    own data."""
    try:
        metadata = json.loads(metadata_file.read_text()) if metadata_file else None
        rel = load_release_file(release, metadata)
        for array in array_files:
            import numpy as np

            rel.extra[array.name.removesuffix(".npy")] = np.load(array, allow_pickle=False)
        families = families_for(rel, classifiers)
        names = rel.metadata.get("feature_names")
        # A table in the dataset's declared columns (categories, gaps) is encoded as uploaded.
        declared = rel.metadata.get("declared_columns")
        X_test, y_test = load_records(
            test_file, label_column=label_column, feature_names=names, declared=declared
        )
        reference = (
            load_records(
                reference_file, label_column=label_column, feature_names=names, declared=declared
            )
            if reference_file
            else None
        )
    except (KeyError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if reference is None:
        click.echo("no --reference file: the report has no non-private reference", err=True)
    total = 1 + len(families) * (2 if reference is not None else 1)
    with tqdm(total=total, file=sys.stderr, desc="evaluate", unit="model", leave=False) as bar:

        def on_result(name: str, row: dict[str, Any]) -> None:
            bar.write(_line(name, row), file=sys.stderr)
            bar.update(1)

        try:
            report = evaluate(
                rel,
                X_test,
                y_test,
                classifiers=families,
                postprocessing=postprocess,
                epochs=epochs,
                seed=seed,
                reference=reference,
                on_result=on_result,
            )
        except (KeyError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report, indent=2))
