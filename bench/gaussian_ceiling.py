"""What a Gaussian-per-class release could reach without noise, and what relabelling adds.

Two measurements behind docs/results/moment_model.md ("The blend chosen from the fit"):

- ``mixture``: per class, a non-private scikit-learn ``KMeans`` with ``--components`` clusters in
  the release's basis (2-D DCT, k = 128 coefficients of unit rows, clip C = 7), each cluster's
  exact mean, covariance pooled within the class or each cluster's own; as many rows drawn as
  the class holds, decoded, clipped to [0, 1] (no value matching). The model family's ceiling.
- ``relabel``: a ClustMix release (service defaults, ``--epsilon``, FastNoise, ``--seed``) whose
  rows are relabelled by a CNN trained, without privacy, on the private images: what the best
  possible labeller adds to the sampled rows. Not a mechanism (the labeller is not private).

    DPRELEASE_SHARED=/work/shared python -m bench.gaussian_ceiling mixture --components 5
    DPRELEASE_SHARED=/work/shared python -m bench.gaussian_ceiling relabel --epsilon 10

Scored as the rest of the study (``bench.moment_model.score``: x/255, 5000 held-out images).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

from bench.mnist import SHARED, load_private, load_test
from bench.moment_model import score
from dpcore.mechanisms.basis import dct_basis

CLIP = 7.0
K = 128


def private_rows() -> tuple[np.ndarray, np.ndarray]:
    """The private images as flat rows in [0, 1] (x/255) and their classes."""
    data = load_private(Path(os.environ.get("DPRELEASE_SHARED", SHARED)))
    X = np.asarray(data.X, dtype=np.float64).reshape(len(data.X), -1) / 255.0
    classes = np.asarray([int(c) for c in data.classes])
    return X, classes[data.labels]


def coordinates(
    k: int = K, clip: float = CLIP
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``private_rows`` (R, classes), then the release's coordinates of R: unit rows (norm
    clipped to ``clip``, divided by it) on the first ``k`` 2-D DCT functions, and that basis
    (784 × k): (R, classes, Z, B)."""
    R, labels = private_rows()
    B = np.asarray(dct_basis((28, 28), k), dtype=np.float64)
    B = B if B.shape[0] == R.shape[1] else B.T
    U = R / np.maximum(1.0, np.linalg.norm(R, axis=1, keepdims=True) / clip) / clip
    return R, labels, U @ B, B


def mixture(components: int, own: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans

    _, labels, Z, B = coordinates()
    rng = np.random.default_rng(seed)
    rows, ys = [], []
    for c in np.unique(labels):
        Zc = Z[labels == c]
        fit = KMeans(components, n_init=3, random_state=seed) if components > 1 else None
        member = fit.fit_predict(Zc) if fit is not None else np.zeros(len(Zc), dtype=int)
        means = np.stack([Zc[member == j].mean(0) for j in range(components)])
        centred = Zc - means[member]
        pooled = centred.T @ centred / len(Zc)
        for j in range(components):
            part = Zc[member == j]
            cov = np.cov(part.T, bias=True) + 1e-6 * np.eye(K) if own else pooled
            rows.append(rng.multivariate_normal(means[j], cov, size=len(part)))
            ys += [int(c)] * len(part)
    return np.clip(np.vstack(rows) @ B.T * CLIP, 0.0, 1.0), np.asarray(ys)


def relabel(epsilon: float, seed: int, X: np.ndarray, test: np.ndarray) -> np.ndarray:
    from dpcore.evaluation.models import FAMILIES, TrainingSet

    R, labels = private_rows()
    both = np.vstack([X, test])
    data = TrainingSet(R, np.eye(10)[labels], both, (28, 28), soft=False, epochs=10, seed=seed)
    return np.asarray(FAMILIES["cnn"](data).labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["mixture", "relabel"])
    parser.add_argument("--components", type=int, default=1)
    parser.add_argument("--own", action="store_true", help="each cluster's own covariance")
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--families", default="sklearn_mlp,knn,rf")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    families = args.families.split(",")
    result: dict[str, object] = {"what": args.what, "seed": args.seed}
    if args.what == "mixture":
        X, y = mixture(args.components, args.own, args.seed)
        result.update(components=args.components, own=args.own)
        result.update(score(X, y, test, test_labels, families, args.seed))
    else:
        from bench import clustmix_gaussian

        X, y = clustmix_gaussian.release_rows(args.epsilon, args.seed)
        labels = relabel(args.epsilon, args.seed, X, test)
        teacher, test_pred = labels[: len(X)], labels[len(X) :]
        result.update(epsilon=args.epsilon, labeller_test=float((test_pred == test_labels).mean()))
        result["agree"] = float((teacher == y).mean())
        result["own_labels"] = score(X, y, test, test_labels, families, args.seed)
        result["relabelled"] = score(X, teacher, test, test_labels, families, args.seed)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
