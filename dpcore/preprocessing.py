"""Preprocessing that uses only public, owner-declared facts (bounds and the label set)."""

from __future__ import annotations

import numpy as np


def scale_to_unit(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Map every feature from its declared [lo, hi] to [0, 1] (values are clipped first)."""
    X = np.clip(np.asarray(X, dtype=np.float64), lo, hi)
    return (X - lo) / (hi - lo)


def clip_rows_l2(X: np.ndarray, max_norm: float = 1.0) -> np.ndarray:
    """Scale each row down to L2 norm ≤ max_norm; rows already inside are unchanged."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.maximum(norms / max_norm, 1.0)


def unit_features(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Unit-scale features: [0, 1] per feature, then each row scaled to L2 norm ≤ 1. Two such
    rows differ by at most √2 (their inner product is ≥ 0)."""
    return clip_rows_l2(scale_to_unit(X, lo, hi))


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    out = np.zeros((labels.shape[0], n_classes), dtype=np.float64)
    out[np.arange(labels.shape[0]), labels] = 1.0
    return out


def standardise(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x − mean)/std with owner-declared (public) statistics."""
    if np.any(np.asarray(std) <= 0):
        raise ValueError("declared standard deviations must be > 0")
    return (np.asarray(X, dtype=np.float64) - mean) / std
