"""MST against ClustMix on the study's tables: one default release each (T = n, the secure
sampler, the worker's row steps via ``bench.sweet_spot.make_release``), scored by four
families on the held-out rows, both scaled by the declared bounds only.

    OMP_NUM_THREADS=1 python -m bench.mst_compare make_classification 1 mst
    OMP_NUM_THREADS=1 python -m bench.mst_compare breast_cancer 10 clustmix
    OMP_NUM_THREADS=1 python -m bench.mst_compare wine 1 mst '{"structure": "label"}'

Prints one line: the charge, time, rows, distinct rows, in-domain share and each family's
accuracy (docs/results/mst.md).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np


def main(name: str, epsilon: float, mechanism: str, request: dict[str, Any]) -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import MinMaxScaler

    from bench.sweet_spot import make_release
    from bench.tabular_data import DATASETS

    table = DATASETS[name](None)
    private = table.private
    start = time.time()
    release, event = make_release(mechanism, request, private, epsilon, 1e-5)
    seconds = time.time() - start
    X, y = release.X, release.Y.argmax(axis=1)
    y_test = np.array([list(private.classes).index(v) for v in table.y_test])
    scale = MinMaxScaler().fit(np.vstack([private.lo, private.hi]))
    families = {
        "rf": RandomForestClassifier(200, random_state=0),
        "hgb": HistGradientBoostingClassifier(),
        "knn": KNeighborsClassifier(5),
        "logistic": LogisticRegression(max_iter=2000),
    }
    scores = {}
    for family, model in families.items():
        if len(np.unique(y)) < 2:
            scores[family] = float("nan")
            continue
        model.fit(scale.transform(X), y)
        predicted = model.predict(scale.transform(table.X_test))
        scores[family] = round(float((predicted == y_test).mean()), 3)
    inside = float(np.mean((private.lo - 1e-9 <= X) & (private.hi + 1e-9 >= X)))
    print(
        name,
        mechanism,
        json.dumps(request),
        epsilon,
        f"charged={event.epsilon(1e-5):.4f} seconds={seconds:.1f} rows={len(X)} "
        f"distinct={len(np.unique(X, axis=0))} in_domain={inside:.3f}",
        scores,
        flush=True,
    )


if __name__ == "__main__":
    main(
        sys.argv[1],
        float(sys.argv[2]),
        sys.argv[3] if len(sys.argv) > 3 else "mst",
        json.loads(sys.argv[4]) if len(sys.argv) > 4 else {},
    )
