"""Two probes for a generator sharper than one Gaussian per class (docs/results/records.md,
"What the MLP targets need"), on MNIST-10k, scored as bench/moment_model.py scores (x/255,
5 000 held-out images).

- ``decoder``: a network trained on the private rows to map a row's first k 2-D DCT
  coefficients (unit rows clipped to norm C, as ClustMix reads them) and its class to the
  pixels (sigmoid outputs, binary cross-entropy), fed with draws of each class's exact
  (noise-free) Gaussian in those coefficients: ``--output mean`` (the pixel probabilities),
  ``bernoulli`` (pixels drawn from them) or ``linear`` (the coefficients decoded linearly, as
  ClustMix does; no network). Non-private: a ceiling of the idea.
- ``filter``: the default ClustMix release at ``--epsilon`` with ``--over`` times the rows,
  of which each class keeps the rows a classifier trained (non-privately) on the private rows
  finds most typical of their class. Non-private labeller: a ceiling of the idea.

    DPRELEASE_SHARED=/work/shared python -m bench.sharper_generator decoder --output bernoulli
    DPRELEASE_SHARED=/work/shared python -m bench.sharper_generator filter --epsilon 10

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch

from bench.gaussian_ceiling import coordinates, private_rows
from bench.mnist import load_test
from bench.moment_model import score


def _fit(net: torch.nn.Module, X: torch.Tensor, T: torch.Tensor, loss: Any, epochs: int) -> None:
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(int(epochs * len(X) / 256)):
        idx = torch.randint(0, len(X), (256,))
        opt.zero_grad()
        loss(net(X[idx]), T[idx]).backward()
        opt.step()


def decoder(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    R, labels, Z, B = coordinates(args.k, args.clip)
    rng = np.random.default_rng(args.seed)
    draws, ys = [], []
    for c in range(10):
        Zc = Z[labels == c]
        draws.append(rng.multivariate_normal(Zc.mean(0), np.cov(Zc.T, bias=True), size=len(Zc)))
        ys += [c] * len(Zc)
    Zs, y = np.vstack(draws), np.asarray(ys)
    if args.output == "linear":
        return np.clip(Zs @ B.T * args.clip, 0, 1), y
    scale = 1.0 / Z.std()

    def inputs(z: np.ndarray, c: np.ndarray) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(torch.tensor(c), 10).float()
        return torch.cat([torch.tensor(z * scale, dtype=torch.float32), onehot], 1)

    net = torch.nn.Sequential(
        torch.nn.Linear(args.k + 10, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 784),
    )
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    _fit(net, inputs(Z, labels), torch.tensor(R, dtype=torch.float32), bce, args.epochs)
    with torch.no_grad():
        P = torch.sigmoid(net(inputs(Zs, y))).numpy().astype(np.float64)
    return (P if args.output == "mean" else (rng.random(P.shape) < P).astype(float)), y


def filtered(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    from bench import clustmix_gaussian

    R, labels = private_rows()
    rel = clustmix_gaussian.release(
        args.epsilon, {"n_samples": len(R) * args.over}, "array", args.seed
    )
    X, y = rel.raw / 255.0, rel.y
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ce = torch.nn.functional.cross_entropy
    _fit(net, torch.tensor(R, dtype=torch.float32), torch.tensor(labels), ce, args.epochs)
    with torch.no_grad():
        P = torch.softmax(net(torch.tensor(X, dtype=torch.float32)), 1).numpy()
    typical = P[np.arange(len(y)), y]
    keep = [
        np.nonzero(y == c)[0][np.argsort(-typical[y == c])[: int((y == c).sum()) // args.over]]
        for c in range(10)
    ]
    kept = np.concatenate(keep)
    return X[kept], y[kept]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("probe", choices=["decoder", "filter"])
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--clip", type=float, default=7.0)
    parser.add_argument("--output", choices=["mean", "bernoulli", "linear"], default="mean")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--over", type=int, default=3)
    parser.add_argument("--families", default="sklearn_mlp,knn,rf")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    X, y = decoder(args) if args.probe == "decoder" else filtered(args)
    test_images, test_labels = load_test()
    test = test_images.reshape(len(test_images), -1) / 255.0
    result: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "families"}
    result["rows"] = len(X)
    result.update(score(X, y, test, test_labels, args.families.split(","), args.seed))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
