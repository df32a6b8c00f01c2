"""ClustMix through its release job (``dpcore.mechanisms.run.build``, the accountant's
calibration, the declared noise) on MNIST-10k with the service's defaults (the spec's shape
defaults fill whatever ``--params`` leaves out, as a request does), scored as an analyst would:
the released rows in raw units scaled by the declared range (x/255), real held-out images
likewise. ``--upload``: the images as a 28×28 NPZ array, as flat rows with feature_shape
[28, 28], or as flat rows without it.

    DPRELEASE_SHARED=/work/shared nice -n 10 python -m bench.clustmix_gaussian --epsilon 1 \
        --upload flat-shaped --families rf,hgb,knn,logistic,sklearn_mlp,cnn

Prints one JSON line (figures in docs/results/moment_model.md, "Served").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.mnist import DELTA, SHARED, load_private, load_test
from bench.moment_model import score
from dpcore.mechanisms import registry
from dpcore.mechanisms.clustmix.accounting import ClustMixDPEvent
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom


@dataclass(frozen=True)
class Released:
    params: dict[str, Any]
    charged: float
    X: np.ndarray  # unit scale, as the job wrote it
    raw: np.ndarray  # mapped to the declared range
    y: np.ndarray
    rows_note: str
    seconds: float


def release(epsilon: float, request: dict[str, Any], upload: str, seed: int) -> Released:
    """One release through the job's build, the spec's defaults filling ``request``."""
    shape = {"array": None, "flat-shaped": [28, 28], "flat": [784]}[upload]
    data = load_private(Path(os.environ.get("DPRELEASE_SHARED", SHARED)), feature_shape=shape)
    spec = registry.get("clustmix")
    facts = facts_of(data)
    resolved = spec.resolve(spec.request_params.model_validate(request), facts)
    params = resolved.model_dump()
    tight = spec.accountant("tight")
    event = tight.calibrate(epsilon, DELTA, spec.accountant_keys(tight, resolved, facts))
    assert isinstance(event, ClustMixDPEvent)
    noise = noise_for("clustmix", params, facts, sigma=event.sigma)
    generator = SecureRandom.from_seed(seed)
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
    note = str(out.preprocessing.get("rows", ""))
    return Released(params, event.epsilon(DELTA), X, raw, y, note, seconds)


def release_rows(epsilon: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The default release of the array upload, scaled by the declared range (x/255)."""
    released = release(epsilon, {}, "array", seed)
    return released.raw / 255.0, released.y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--families", default="logistic,knn,rf")
    parser.add_argument("--upload", choices=["array", "flat-shaped", "flat"], default="array")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    released = release(args.epsilon, json.loads(args.params), args.upload, args.seed)
    X, raw, y, params = released.X, released.raw, released.y, released.params
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    result: dict[str, Any] = {
        "epsilon": args.epsilon,
        "upload": args.upload,
        "charged": released.charged,
        "params": params,
        "rows": len(X),
        "distinct": len(np.unique(X.round(6), axis=0)),
        "in_range": bool(raw.min() >= 0 and raw.max() <= 255 * (1 + 1e-6)),
        # Released values at the lower bound (MNIST's own pixels: 0.807 at 0).
        "at_lower_bound": round(float((raw <= 1e-6).mean()), 3),
        "release_s": round(released.seconds, 1),
    }
    # The blend the release applied (values matched; unset: the automatic one).
    blended = re.search(r"blended ([0-9.e-]+)", released.rows_note)
    if params.get("values") == "matched":
        result["value_blend_applied"] = float(blended.group(1)) if blended else 1.0
    scores = score(raw / 255.0, y, test, test_labels, args.families.split(","), args.seed)
    result.update({name: round(value, 3) for name, value in scores.items()})
    result["worst"] = min(scores.values())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
