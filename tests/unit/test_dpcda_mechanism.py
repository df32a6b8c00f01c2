"""DP-CDA's sampler: class-balanced, ℓ distinct members of the mixture's own class, exact
labels, uniform subsets."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms.dpcda.generate import generate, per_class
from dpcore.mechanisms.secure_random import SecureRandom


def _run(labels: list[int], ell: int, T: int, sigma: float = 0.0, seed: int = 0):  # type: ignore[no-untyped-def]
    n = len(labels)
    chunks = list(
        generate(
            torch.eye(n, dtype=torch.float64),
            torch.tensor(labels),
            n_classes=max(labels) + 1,
            mixture_degree=ell,
            n_samples=T,
            sigma=sigma,
            clip_norm=1.0,
            generator=SecureRandom.from_seed(seed),
        )
    )
    return torch.cat([c[0] for c in chunks]).numpy(), torch.cat([c[1] for c in chunks]).numpy()


def test_class_balanced_members_of_own_class_and_exact_labels() -> None:
    labels = [0] * 7 + [1] * 5 + [2] * 9
    X, Y = _run(labels, ell=3, T=10)
    assert X.shape[0] == 3 * per_class(10, 3) == 12
    members = np.round(X * 3).astype(int)
    assert set(np.unique(members)) <= {0, 1}
    assert (members.sum(axis=1) == 3).all()
    classes = np.array(labels)
    for row, onehot in zip(members, Y, strict=True):
        c = int(onehot.argmax())
        assert onehot.sum() == 1
        assert (classes[row == 1] == c).all()


def test_subsets_within_a_class_are_uniform() -> None:
    labels = [0] * 6 + [1] * 2
    X, Y = _run(labels, ell=2, T=2 * 6000, seed=3)
    rows = X[Y[:, 0] == 1]
    seen = [tuple(np.flatnonzero(r)) for r in rows]
    _, counts = np.unique(seen, axis=0, return_counts=True)
    assert len(counts) == len(list(combinations(range(6), 2)))
    assert stats.chisquare(counts).pvalue > 1e-4


def test_noise_and_small_class() -> None:
    X, _ = _run([0] * 50 + [1] * 50, ell=2, T=4000, sigma=2.0, seed=1)
    assert abs(X.std() - 2.0) < 0.05
    with pytest.raises(ValueError, match="fewer records"):
        _run([0] * 5 + [1] * 1, ell=2, T=4)
