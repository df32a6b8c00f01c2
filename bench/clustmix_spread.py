"""ClustMix `spread` on MNIST-10k: one release per spread value at (ε, K), n_samples 2000,
δ = 1e-5, accuracy on the 5000 held-out test images for scikit-learn's MLP, ridge (linear),
logistic regression and HistGradientBoosting. Prints one JSON line per release.

    OMP_NUM_THREADS=1 python bench/clustmix_spread.py EPSILON K SPREAD [SPREAD ...]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mnist import load_private, load_test
from bench.sweet_spot import run_one

FAMILIES = ["sklearn_mlp", "hgb", "linear", "logistic"]


def main(argv: list[str]) -> None:
    epsilon, clusters = float(argv[0]), int(argv[1])
    parsed, test = load_private(), load_test()
    for spread in (float(s) for s in argv[2:]):
        start = time.perf_counter()
        row = run_one(
            "clustmix",
            epsilon,
            clusters,
            parsed,
            test,
            families=FAMILIES,
            extra={"n_samples": 2000, "spread": spread},
            epochs=10,
        )
        seconds = round(time.perf_counter() - start, 1)
        out = {"epsilon": epsilon, "K": clusters, "spread": spread, "seconds": seconds}
        print(json.dumps({**out, **{f: row[f] for f in FAMILIES}}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
