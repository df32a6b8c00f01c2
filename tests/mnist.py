"""The MNIST test split (IDX files) shipped in shared/, beside the repository clone."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dprelease_cli.idx import read_idx

__all__ = ["IMAGES", "LABELS", "MNIST_DIR", "available", "load_mnist_t10k", "read_idx"]

_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DPRELEASE_SHARED", _ROOT.parent / "shared"))
MNIST_DIR = SHARED / "datasets" / "mnist-t10k"
IMAGES = MNIST_DIR / "t10k-images-idx3-ubyte.gz"
LABELS = MNIST_DIR / "t10k-labels-idx1-ubyte.gz"


def load_mnist_t10k() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (10000, 28, 28), labels uint8 (10000,))."""
    return read_idx(IMAGES), read_idx(LABELS)


def available() -> bool:
    return IMAGES.is_file() and LABELS.is_file()
