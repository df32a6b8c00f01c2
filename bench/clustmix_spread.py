"""ClustMix `spread` on MNIST-10k: one release per spread value at (ε, K), n_samples 2000,
δ = 1e-5, accuracy on the 5000 held-out test images for scikit-learn's MLP, ridge (linear),
logistic regression and HistGradientBoosting. Prints one JSON line per release.

    OMP_NUM_THREADS=1 python bench/clustmix_spread.py EPSILON K SPREAD [SPREAD ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.clustmix_options import measure

FAMILIES = ["sklearn_mlp", "hgb", "linear", "logistic"]


def main(argv: list[str]) -> None:
    epsilon, clusters = float(argv[0]), int(argv[1])
    measure(epsilon, clusters, [{"spread": float(s)} for s in argv[2:]], FAMILIES)


if __name__ == "__main__":
    main(sys.argv[1:])
