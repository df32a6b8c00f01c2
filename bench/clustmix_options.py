"""ClustMix variant dp's options on MNIST-10k: one release per setting at (ε, K), n_samples
2000, δ = 1e-5, accuracy on the 5000 held-out test images for scikit-learn's MLP, ridge
(linear) and logistic regression (``--families`` to change). Prints one JSON line per release.

    OMP_NUM_THREADS=1 python bench/clustmix_options.py EPSILON K '[{}, {"feature_map": "rff"}]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mnist import load_private, load_test
from bench.sweet_spot import run_one

FAMILIES = ["sklearn_mlp", "linear", "logistic"]


def measure(
    epsilon: float, clusters: int, settings: Sequence[Mapping[str, Any]], families: Sequence[str]
) -> None:
    parsed, test = load_private(), load_test()
    for extra in settings:
        start = time.perf_counter()
        row = run_one(
            "clustmix",
            epsilon,
            clusters,
            parsed,
            test,
            families=list(families),
            extra={"n_samples": 2000, **extra},
            epochs=10,
        )
        seconds = round(time.perf_counter() - start, 1)
        out = {"epsilon": epsilon, "K": clusters, **extra, "seconds": seconds}
        print(json.dumps({**out, **{f: row[f] for f in families}}), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("epsilon", type=float)
    parser.add_argument("clusters", type=int)
    parser.add_argument("settings", type=json.loads, help="JSON list of extra params")
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    args = parser.parse_args(argv)
    measure(args.epsilon, args.clusters, args.settings, args.families)


if __name__ == "__main__":
    main(sys.argv[1:])
