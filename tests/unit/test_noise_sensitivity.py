"""Every mechanism tells the noise sampler the sensitivity its accountant assumes.

The secure sampler raises σ by the lattice slack relative to the sensitivity it is given, so a
sensitivity larger than the true one would under-noise. Here a recording sampler (no noise)
runs the worker's real mechanism code on worst-case neighbours with shared randomness: each
noised row moves by at most the sensitivity passed with it plus the rounding error bound
passed with it (exactly, no tolerance), and the worst case reaches the sensitivity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import registry
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset
from tests.datasets import unit_dataset


@dataclass
class Recorder:
    """A NoiseSampler that adds nothing and keeps what it was asked to noise."""

    name: str = "recorder"
    calls: list[tuple[torch.Tensor, float, float]] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        self.calls.append((values.detach().double().clone(), sigma, sensitivity))
        self.errors.append(error)
        return values


def _parsed(X: np.ndarray, labels: np.ndarray, n_classes: int) -> ParsedDataset:
    return unit_dataset(X, labels, n_classes)


def _run(mechanism: str, params: dict[str, Any], X: np.ndarray, labels: np.ndarray) -> Recorder:
    recorder = Recorder()
    data = _parsed(X, labels, 2)
    two_scales = "sigma_y" in registry.accountant(mechanism, "tight").key_names
    noise = noise_for(
        mechanism, params, facts_of(data), sigma=0.5, sigma_y=0.5 if two_scales else None
    )
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=recorder,
        generator=SecureRandom.from_seed(3),
        device=torch.device("cpu"),
    )
    for _ in out.chunks:
        pass
    return recorder


def _neighbours(
    n: int, *, same_class: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Record 0 at (1, 0, 0.5) in D and at (0, 1, 0.5) in D′; the rest at (0.5, 0.5, 0.5)."""
    rng = np.random.default_rng(0)
    X = np.full((n, 3), 0.5)
    labels = rng.integers(0, 2, size=n)
    X_prime, labels_prime = X.copy(), labels.copy()
    X[0], X_prime[0] = (1.0, 0.0, 0.5), (0.0, 1.0, 0.5)
    labels[0], labels_prime[0] = 0, (0 if same_class else 1)
    return X, labels, X_prime, labels_prime


CASES = [
    ("dpmix", {"mixture_degree": 4, "n_samples": 300}, False),
    ("dpmix", {"mixture_degree": 4, "n_samples": 300, "assignment": "record"}, False),
    ("sgdrm", {"mixture_width": 4, "n_samples": 300, "coefficient_bound": 0.3}, False),
    ("local_perturbation", {}, False),
    ("random_projection", {"projection_dim": 2, "spectral_norm": 1.5}, False),
    (
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "min_class_size": 4,
            "clip_norm": 0.8,
            "standardization": "declared",
            "feature_mean": [0.5, 0.5, 0.5],
            "feature_std": [0.5, 0.5, 0.5],
        },
        True,
    ),
    (
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "min_class_size": 4,
            "standardization": "dp",
            "stats_noise": 1.0,
        },
        True,
    ),
    # A public basis (a rotation at k = d, a projection below): the same sensitivity holds.
    (
        "sgdrm",
        {
            "mixture_width": 4,
            "n_samples": 300,
            "coefficient_bound": 0.3,
            "basis": "dct",
            "basis_dim": 3,
        },
        False,
    ),
    (
        "sgdrm",
        {
            "mixture_width": 4,
            "n_samples": 300,
            "coefficient_bound": 0.3,
            "basis": "dct",
            "basis_dim": 2,
        },
        False,
    ),
    ("dpmix", {"mixture_degree": 4, "n_samples": 300, "basis": "dct", "basis_dim": 3}, False),
    ("dpmix", {"mixture_degree": 4, "n_samples": 300, "basis": "dct", "basis_dim": 2}, False),
    (
        "dpmix",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "assignment": "record",
            "basis": "dct",
            "basis_dim": 3,
        },
        False,
    ),
    (
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "min_class_size": 4,
            "clip_norm": 0.8,
            "standardization": "declared",
            "feature_mean": [0.5, 0.5, 0.5],
            "feature_std": [0.5, 0.5, 0.5],
            "basis": "dct",
            "basis_dim": 3,
        },
        True,
    ),
    (
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "min_class_size": 4,
            "basis": "dct",
            "basis_dim": 1,
        },
        True,
    ),
]


@pytest.mark.parametrize(("mechanism", "params", "same_class"), CASES)
def test_rows_move_by_at_most_the_declared_sensitivity(
    mechanism: str, params: dict[str, Any], same_class: bool
) -> None:
    X, labels, X_prime, labels_prime = _neighbours(40, same_class=same_class)
    if mechanism == "sgdrm":
        # Its accountant's sensitivity is the radius of one record's contribution: compare
        # with the record's contribution removed (a zero record), not with a replacement.
        X_prime, labels_prime = X.copy(), labels.copy()
    first = _run(mechanism, params, X, labels)
    second = _run(mechanism, params, X_prime, labels_prime)
    if mechanism == "sgdrm":
        second = _zeroed_record_run(params, X, labels)
    assert len(first.calls) == len(second.calls) > 0
    reached = []
    for (a, sigma, declared), (b, sigma_b, declared_b), error in zip(
        first.calls, second.calls, first.errors, strict=True
    ):
        assert (sigma, declared) == (sigma_b, declared_b)
        # Mixtures of float32 rows sum blocks of ≤ 64 in float32 (γ_ℓ for ℓ ≤ 64), the block
        # sums in float64: the cover stays a tiny fraction of Δ at these sizes (ℓ = 4).
        assert 0 <= error < 1e-5 * declared
        moved = torch.linalg.vector_norm(a - b, dim=-1).max().item()
        assert moved <= declared + error, (mechanism, moved, declared, error)
        reached.append(moved / declared)
    # The worst case is reached (the declared sensitivity is not a loose overestimate) except
    # by the random projection, whose worst direction the canary does not follow, and by
    # DP standardisation, which does not map the canary to antipodal points.
    # Nor by a basis that drops coordinates the canary moves along (k < d).
    full = params.get("basis_dim") in (None, X.shape[1])
    if mechanism != "random_projection" and params.get("standardization") != "dp" and full:
        assert max(reached) > 0.99, reached


def _zeroed_record_run(params: dict[str, Any], X: np.ndarray, labels: np.ndarray) -> Recorder:
    """sgdrm with record 0's contribution removed: same randomness, coefficient of record 0
    multiplied by a zero record."""
    from dpcore.mechanisms.basis import BasisParams, basis_for
    from dpcore.mechanisms.sgdrm import generate as sgdrm
    from dpcore.preprocessing import one_hot, unit_features

    features = torch.as_tensor(unit_features(X, np.zeros(3), np.ones(3)), dtype=torch.float32)
    onehot = torch.as_tensor(one_hot(labels, 2), dtype=torch.float32)
    features[0] = 0
    onehot[0] = 0
    chosen = BasisParams.model_validate(
        {k: v for k, v in params.items() if k in ("basis", "basis_dim")}
    )
    basis = basis_for(chosen, (3,), 3, 64)
    recorder = Recorder()
    for _ in sgdrm.generate(
        features,
        onehot,
        mixture_width=params["mixture_width"],
        n_samples=params["n_samples"],
        coefficient_bound=params["coefficient_bound"],
        sigma=0.5,
        generator=SecureRandom.from_seed(3),
        noise=recorder,
        basis=basis if not basis.identity else None,
    ):
        pass
    return recorder


def test_dp_statistics_declare_their_sensitivity() -> None:
    from dpcore.mechanisms.dpcda.release import dp_statistics

    unit = np.full((30, 4), 0.5)
    other = unit.copy()
    unit[0], other[0] = 1.0, 0.0
    first, second = Recorder(), Recorder()
    dp_statistics(unit, 1.0, first)
    dp_statistics(other, 1.0, second)
    ((a, _, declared),), ((b, _, _),) = first.calls, second.calls
    assert declared == pytest.approx(math.sqrt(2 * 4))
    assert torch.linalg.vector_norm(a - b).item() == pytest.approx(declared)


def test_dp_statistics_rounding_is_covered() -> None:
    """The error the statistics pass bounds the float64 sums' rounding (against exact
    rational sums): each neighbour's computed vector is within half of it of the exact one."""
    from fractions import Fraction

    from dpcore.mechanisms.dpcda.release import dp_statistics

    rng = np.random.default_rng(3)
    unit = rng.uniform(0.0, 1.0, size=(3000, 4))
    recorder = Recorder()
    dp_statistics(unit, 1.0, recorder)
    ((computed, _, declared),) = recorder.calls
    (error,) = recorder.errors
    assert 0 < error < 1e-5 * declared
    columns = [unit[:, j] for j in range(4)] + [unit[:, j] ** 2 for j in range(4)]
    exact = [sum((Fraction(float(v)) for v in column), Fraction(0)) for column in columns]
    off = math.sqrt(
        sum(float(Fraction(float(c)) - e) ** 2 for c, e in zip(computed[0], exact, strict=True))
    )
    assert off > 0  # the sums do round
    assert off <= error / 2


def _rounded_up_unit_pair(d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Two orthogonal non-negative rows of float64 norm 1 whose float32 copies (what the
    generators read) have the largest norm among a sweep: the stored rows exceed the
    preprocessing's bound, so neighbours move by more than the exact √2/ℓ."""
    angles = np.linspace(0.01, np.pi / 2 - 0.01, 20_001)
    pairs = np.stack((np.cos(angles), np.sin(angles)), axis=1)
    stored = pairs.astype(np.float32).astype(np.float64)
    best = pairs[np.argmax(np.linalg.norm(stored, axis=1))]
    x, y = np.zeros(d), np.zeros(d)
    x[:2], y[2:4] = best, best
    return x, y


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("dpmix", {"mixture_degree": 4, "n_samples": 300}),
        ("dpmix", {"mixture_degree": 4, "n_samples": 300, "assignment": "record"}),
        ("local_perturbation", {}),
    ],
)
def test_float32_rounding_of_rows_is_covered(mechanism: str, params: dict[str, Any]) -> None:
    """Adversarial rows: the stored float32 rows of D and D′ are ≈ (1 + 6e-8)·√2 apart, more
    than the accountant's √2 (times 1/ℓ). The rows handed to the sampler exceed the declared
    sensitivity — so a sampler trusting it alone would under-noise — but never the declared
    sensitivity plus the error the generator passes."""
    x, y = _rounded_up_unit_pair()
    n = 40
    X = np.zeros((n, 4))
    X[0] = x
    X_prime = X.copy()
    X_prime[0] = y
    labels = np.zeros(n, dtype=np.int64)
    data, data_prime = _parsed(X, labels, 2), _parsed(X_prime, labels, 2)
    first = _run_data(mechanism, params, data)
    second = _run_data(mechanism, params, data_prime)
    exceeded = False
    for (a, _, declared), (b, _, _), error in zip(
        first.calls, second.calls, first.errors, strict=True
    ):
        moved = torch.linalg.vector_norm(a - b, dim=-1).max().item()
        exceeded |= moved > declared
        assert moved <= declared + error, (moved, declared, error)
    assert exceeded  # the inputs are adversarial: without the error term this would fail


def _run_data(mechanism: str, params: dict[str, Any], data: ParsedDataset) -> Recorder:
    recorder = Recorder()
    two_scales = "sigma_y" in registry.accountant(mechanism, "tight").key_names
    noise = noise_for(
        mechanism, params, facts_of(data), sigma=0.5, sigma_y=0.5 if two_scales else None
    )
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=recorder,
        generator=SecureRandom.from_seed(3),
        device=torch.device("cpu"),
    )
    for _ in out.chunks:
        pass
    return recorder
