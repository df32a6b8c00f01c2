"""ClustMix variant paper (Algorithm 2, a research release) on MNIST-10k: calibrate with the
paper accountant at ε (its claim, not a bound), build the release as the worker does
(``sweet_spot.make_release``), and report sklearn MLP and ridge accuracy on the 5000 held-out
test images. One JSON line per setting.

    OMP_NUM_THREADS=1 python bench/clustmix_paper.py EPSILON '[{"sigma_max": 1.0}, ...]'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mnist import DELTA, load_private, load_test
from bench.sweet_spot import make_release
from dpcore.evaluation import evaluate


def main(argv: list[str]) -> None:
    epsilon = float(argv[0]) if argv else 1.0
    settings = json.loads(argv[1]) if len(argv) > 1 else [{}]
    parsed, test = load_private(), load_test()
    for extra in settings:
        request = {"variant": "paper", "n_samples": 2000, **extra}
        start = time.perf_counter()
        release, event = make_release(
            "clustmix", request, parsed, epsilon, DELTA, accountant_name="paper"
        )
        seconds = time.perf_counter() - start
        report = evaluate(release, test[0], test[1], classifiers=("sklearn_mlp", "linear"))
        line = {
            "eps": epsilon,
            "extra": extra,
            "l": event.cluster_size,
            "sigma": round(event.sigma, 4),
            "eps_claimed": round(event.epsilon(DELTA), 4),
            "rows": len(release.X),
            # One row per cluster, repeated: the clusters are the distinct rows.
            "clusters": len(np.unique(release.X, axis=0)),
            "release_s": round(seconds, 1),
            "acc": report["accuracy"],
            "train_s": report["seconds"],
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
