"""ClustMix model gaussian through its release job (``dpcore.mechanisms.run.build``, the
accountant's calibration, the declared noise) on MNIST-10k, scored as an analyst would: the
released rows in raw units scaled by the declared range (x/255), real held-out images likewise.

    DPRELEASE_SHARED=/work/shared nice -n 10 python -m bench.clustmix_gaussian --epsilon 1 \
        --params '{"clip_norm": 7, "count_share": 0.05}' --families logistic,knn,rf

Prints one JSON line (figures in docs/results/moment_model.md, "Served").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.mnist import DELTA, SHARED, load_private, load_test
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.clustmix.params import ClustMixParams
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom


def _model(name: str) -> Any:
    if name == "logistic":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=300)
    if name == "knn":
        from sklearn.neighbors import KNeighborsClassifier

        return KNeighborsClassifier(n_neighbors=5, n_jobs=2)
    if name == "rf":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(n_estimators=100, n_jobs=2, random_state=0)
    if name == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(random_state=0)
    raise ValueError(f"unknown family {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--families", default="logistic,knn,rf")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = load_private(Path(os.environ.get("DPRELEASE_SHARED", SHARED)))
    params = {"model": "gaussian", "clusters_per_class": 1, **json.loads(args.params)}
    tight = registry.accountant("clustmix", "tight")
    values = ClustMixParams.model_validate(params).model_dump()
    keys = {k: values[k] for k in tight.key_names if k in values}
    keys["n"] = len(data.labels)
    event = tight.calibrate(args.epsilon, DELTA, keys)
    assert isinstance(event, ClustMixDPEvent)
    noise = noise_for("clustmix", params, facts_of(data), sigma=event.sigma)
    generator = SecureRandom.from_seed(args.seed)
    start = time.time()
    out = build(
        "clustmix",
        params,
        data,
        noise=noise,
        sampler=FastNoise(generator),
        generator=generator,
        device=torch.device("cpu"),
    )
    chunks = list(out.chunks)
    X = torch.cat([x for x, _ in chunks]).double().numpy()
    y = torch.cat([labels for _, labels in chunks]).numpy().argmax(axis=1)
    seconds = time.time() - start
    assert out.transform is not None
    raw = out.transform.to_raw(X)
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    result: dict[str, Any] = {
        "epsilon": args.epsilon,
        "charged": event.epsilon(DELTA),
        "params": params,
        "rows": len(X),
        "distinct": len(np.unique(X.round(6), axis=0)),
        "in_range": bool(raw.min() >= 0 and raw.max() <= 255 * (1 + 1e-6)),
        "release_s": round(seconds, 1),
    }
    for family in args.families.split(","):
        model = _model(family).fit(raw / 255.0, y)
        result[family] = round(float((model.predict(test) == test_labels).mean()), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
