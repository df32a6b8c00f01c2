"""``dprelease evaluate``: what a release is worth, measured on real data (offline)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from dpcore.evaluation import CLASSIFIERS, POSTPROCESSING, evaluate, load_release


@click.command("evaluate")
@click.argument("release", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--test",
    "test_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="NPZ with X (real records, raw scale, same features as the dataset) and y (labels).",
)
@click.option(
    "--classifier",
    "classifiers",
    type=click.Choice([*CLASSIFIERS, "all"]),
    multiple=True,
    help="Model family, repeatable; default linear and mlp. linear: ridge on the label matrix; "
    "logistic, sklearn_mlp, hgb: scikit-learn's LogisticRegression, MLPClassifier and "
    "HistGradientBoostingClassifier with default settings on hard labels (argmax); mlp, cnn: "
    "small torch networks (cnn: image-shaped data only). 'all': every family.",
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
    classifiers: tuple[str, ...],
    postprocess: str,
    epochs: int,
    seed: int,
) -> None:
    """Train classifiers on an NPZ RELEASE and report each one's accuracy on real test data and
    its training seconds, with simple fidelity figures. Prints one JSON object. Costs no
    privacy: it only reads the release and your own test data."""
    if "all" in classifiers:
        classifiers = CLASSIFIERS
    try:
        rel = load_release(release.read_bytes())
        with np.load(test_file, allow_pickle=False) as test:
            X_test, y_test = test["X"], test["y"]
        report = evaluate(
            rel,
            X_test,
            y_test,
            classifiers=classifiers or ("linear", "mlp"),
            postprocessing=postprocess,
            epochs=epochs,
            seed=seed,
        )
    except (KeyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report, indent=2))
