"""The row-norm bound C (``clip_norm``) measured on the tabular study's tables (issue 15 item 2).

Usage:
    python bench/clip_norm.py --datasets breast_cancer wine make_classification digits \
        --mechanisms dpmix dpcda clustmix local_perturbation [--epsilon 1] [--repeats 2]

For each table of the tabular study (bench/tabular_data.py: split, declared columns) and each C
in {1, √d/4, √d/2, ⌈√d⌉/2, √d}: the share of private rows the clip changes, and the balanced
accuracy of logistic regression and HistGradientBoosting (scikit-learn defaults) trained on the
release as served (raw units, scaled per column by the declared bounds,
dpcore.evaluation.model_scale) and tested on the held-out rows, mean over --repeats releases at
ε, δ = 1/n². One JSON line per (table, C, mechanism) on stdout. MNIST is measured with
bench/sweet_spot.py --param clip_norm=C (docs/results/clip_norm.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sweet_spot import make_release  # noqa: E402
from bench.tabular import test_space  # noqa: E402
from bench.tabular_data import DATASETS  # noqa: E402
from dpcore.evaluation import class_indices, model_scale  # noqa: E402
from dpcore.preprocessing import scale_to_unit  # noqa: E402


def balanced(X: np.ndarray, labels: np.ndarray, Xt: np.ndarray, yt: np.ndarray) -> dict[str, float]:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    out: dict[str, float] = {}
    models = {
        "logistic": LogisticRegression(max_iter=1000),
        "hgb": HistGradientBoostingClassifier(),
    }
    for name, model in models.items():
        if len(np.unique(labels)) < 2:  # an empty or one-class release: chance
            out[name] = 1.0 / len(np.unique(yt))
            continue
        model.fit(X, labels)
        out[name] = float(balanced_accuracy_score(yt, model.predict(Xt)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--mechanisms", nargs="+", default=["dpmix", "dpcda", "clustmix"])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for name in args.datasets:
        table = DATASETS[name](None)
        parsed = table.private
        d, n = parsed.n_features, parsed.n_rows
        norms = np.linalg.norm(scale_to_unit(parsed.X, parsed.lo, parsed.hi), axis=1)
        root = math.sqrt(d)
        for clip in (1.0, root / 4, root / 2, math.ceil(root) / 2, root):
            for mechanism in args.mechanisms:
                runs = []
                for _ in range(args.repeats):
                    release, _event = make_release(
                        mechanism, {"clip_norm": clip}, parsed, args.epsilon, 1.0 / n**2
                    )
                    scaled = model_scale(release.metadata)
                    Xt = scaled(test_space(release, table.X_test))
                    yt = class_indices(release, table.y_test)
                    if len(release.X) == 0:
                        runs.append(balanced(np.zeros((0, d)), np.zeros(0), Xt, yt))
                        continue
                    labels = release.Y.argmax(axis=1)
                    runs.append(balanced(scaled(release.X), labels, Xt, yt))
                row = {
                    "dataset": name,
                    "mechanism": mechanism,
                    "epsilon": args.epsilon,
                    "clip_norm": round(clip, 3),
                    "rows_clipped": round(float((norms > clip).mean()), 3),
                    **{k: round(float(np.mean([r[k] for r in runs])), 3) for k in runs[0]},
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
