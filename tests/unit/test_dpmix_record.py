"""The record-assignment sampler is what the record accountants assume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms import registry
from dpcore.mechanisms.dpmix.generate import generate_by_record, mixtures_per_record
from dpcore.mechanisms.secure_random import SecureRandom


def _run(n: int, ell: int, T: int, seed: int = 0, sigma: float = 0.0) -> tuple[np.ndarray, ...]:
    # Identity features reveal exactly which records each mixture holds.
    features = torch.eye(n, dtype=torch.float64)
    labels = torch.ones((n, 1), dtype=torch.float64)
    gen = SecureRandom.from_seed(seed)
    chunks = list(
        generate_by_record(
            features,
            labels,
            mixture_degree=ell,
            n_samples=T,
            sigma_x=sigma,
            sigma_y=sigma,
            generator=gen,
        )
    )
    X = torch.cat([c[0] for c in chunks]).numpy()
    Y = torch.cat([c[1] for c in chunks]).numpy()
    return X, Y


def test_every_record_joins_exactly_k_distinct_mixtures() -> None:
    n, ell, T = 30, 4, 20
    X, Y = _run(n, ell, T)
    k = mixtures_per_record(n=n, mixture_degree=ell, n_samples=T)
    assert k == 3 and X.shape == (T, n)
    membership = np.round(X * ell).astype(int)  # entry (t, i) = 1 iff record i is in mixture t
    assert set(np.unique(membership)) <= {0, 1}
    assert (membership.sum(axis=0) == k).all()
    # The mixture weight is 1/ℓ per member, labels are mixed the same way.
    assert np.allclose(Y[:, 0], membership.sum(axis=1) / ell)


def test_each_record_chooses_its_mixtures_uniformly_and_independently() -> None:
    n, ell, T = 400, 1, 8  # k = 1: each record picks one of 8 mixtures
    X, _ = _run(n, ell, T, seed=1)
    choice = X.argmax(axis=0)
    counts = np.bincount(choice, minlength=T)
    assert stats.chisquare(counts).pvalue > 1e-4
    # k = ⌈Tℓ/n⌉ = ⌈4·300/600⌉ = 2 of T = 4: all 6 pairs equally likely.
    n, ell, T = 600, 300, 4
    assert mixtures_per_record(n=n, mixture_degree=ell, n_samples=T) == 2
    X, _ = _run(n, ell, T, seed=2)
    membership = np.round(X * ell).astype(int)
    pairs = [tuple(np.flatnonzero(col)) for col in membership.T]
    assert all(len(p) == 2 for p in pairs)
    _, pair_counts = np.unique(pairs, axis=0, return_counts=True)
    assert len(pair_counts) == 6 and stats.chisquare(pair_counts).pvalue > 1e-4


def test_noise_and_accountant_agree_on_k() -> None:
    n, ell, T = 50, 5, 23
    X, _ = _run(n, ell, T, sigma=3.0, seed=4)
    assert 2.5 < X.std() < 3.5
    event = registry.accountant("dpmix", "tight").at_sigma(
        1.0, {"n": n, "mixture_degree": ell, "n_samples": T, "assignment": "record"}
    )
    assert event.describe()["mixtures_per_record"] == mixtures_per_record(
        n=n, mixture_degree=ell, n_samples=T
    )


def test_shapes_mismatch() -> None:
    with pytest.raises(ValueError):
        next(
            generate_by_record(
                torch.zeros((3, 2)),
                torch.zeros((4, 1)),
                mixture_degree=1,
                n_samples=2,
                sigma_x=1,
                sigma_y=1,
                generator=SecureRandom(),
            )
        )
