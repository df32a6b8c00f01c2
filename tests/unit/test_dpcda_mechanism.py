"""DP-CDA's sampler: class-balanced, ℓ distinct members of the mixture's own class, exact
labels, uniform subsets."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms.class_mixing import per_class
from dpcore.mechanisms.dpcda.generate import generate
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
            nonnegative=True,
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


# --- sensitivity: √2·C/ℓ in unit_range (features ≥ 0), pinned on worst-case neighbours ------


class _Recorder:
    """A noise sampler that adds nothing and keeps each noised batch and its sensitivity."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, float]] = []

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        self.calls.append((values.detach().double().clone(), sensitivity))
        return values


def _release_rows(X: np.ndarray, labels: np.ndarray, params: dict, lo: float, hi: float):  # type: ignore[no-untyped-def, type-arg]
    """The worker's DP-CDA path (params model, preprocessing, generator) with a recording
    sampler and fixed subset randomness."""
    from dpcore.mechanisms.run import build, facts_of, noise_for
    from service.datasets.parsing import ParsedDataset

    d = X.shape[1]
    data = ParsedDataset(
        X=X,
        feature_shape=(d,),
        feature_names=[f"f{i}" for i in range(d)],
        labels=labels,
        classes=[0, 1],
        classes_declared=True,
        lo=np.full(d, lo),
        hi=np.full(d, hi),
        clipped_values=0,
    )
    noise = noise_for("dpcda", params, facts_of(data), sigma=0.5)
    recorder = _Recorder()
    out = build(
        "dpcda",
        params,
        data,
        noise=noise,
        sampler=recorder,
        generator=SecureRandom.from_seed(7),
        device=torch.device("cpu"),
    )
    for _ in out.chunks:
        pass
    return recorder, noise


def _moved(first: _Recorder, second: _Recorder) -> tuple[float, float]:
    """The largest L2 move of a noised row between two runs, and the declared sensitivity."""
    moved, declared = 0.0, set()
    for (a, s_a), (b, s_b) in zip(first.calls, second.calls, strict=True):
        moved = max(moved, torch.linalg.vector_norm(a - b, dim=-1).max().item())
        declared |= {s_a, s_b}
    assert len(declared) == 1
    return moved, declared.pop()


# Declared class sizes (both classes hold exactly m): the mixing's rows are the only noised
# rows, so every recorded call is a mixture (DP class sizes add a counts call).
PARAMS = {
    "mixture_degree": 4,
    "n_samples": 400,
    "min_class_size": 10,
    "clip_norm": 1.5,
    "class_sizes": "declared",
}


def test_unit_range_sensitivity_is_sqrt2_c_over_ell_and_reached() -> None:
    """Orthogonal records of norm C (ones on disjoint halves, scaled down to C) are √2·C
    apart: a mixture holding the replaced record moves by exactly √2·C/ℓ, the declared
    sensitivity, imported from the accountant; no row moves further."""
    from dpcore.mechanisms.class_mixing import mixture_sensitivity

    n, d = 20, 6
    X = np.zeros((n, d))
    X_prime = X.copy()
    X[0, :3], X_prime[0, 3:] = 1.0, 1.0
    labels = np.array([0] * 10 + [1] * 10)
    first, noise = _release_rows(X, labels, PARAMS, 0.0, 1.0)
    second, _ = _release_rows(X_prime, labels, PARAMS, 0.0, 1.0)
    moved, declared = _moved(first, second)
    expected = math.sqrt(2) * 1.5 / 4
    assert declared == pytest.approx(expected, rel=1e-12)
    assert noise.scale("features").sensitivity == declared
    assert declared == mixture_sensitivity(clip_norm=1.5, mixture_degree=4, nonnegative=True)
    assert moved == pytest.approx(expected, rel=1e-6)  # reached (float32 rows) …
    assert moved <= expected * (1 + 1e-6)  # … and not passed


def test_unit_range_rows_never_move_more_on_random_neighbours() -> None:
    """Raw values far outside the declared range and of both signs: after the unit-range
    scaling and the clip, every record is ≥ 0, so replacing one moves no mixture by more
    than √2·C/ℓ (2C/ℓ would be reached with signs free)."""
    rng = np.random.default_rng(5)
    n, d = 20, 5
    labels = np.array([0] * 10 + [1] * 10)
    worst = 0.0
    for trial in range(30):
        X = rng.normal(0, 3, size=(n, d))
        X_prime = X.copy()
        X_prime[0] = rng.normal(0, 3, size=d)
        if trial % 2:
            X[0], X_prime[0] = np.where(rng.random(d) < 0.5, 2.0, -2.0), -X[0]
        first, _ = _release_rows(X, labels, PARAMS, -1.0, 1.0)
        second, _ = _release_rows(X_prime, labels, PARAMS, -1.0, 1.0)
        moved, declared = _moved(first, second)
        worst = max(worst, moved / declared)
        assert all(bool((a >= 0).all()) for a, _ in first.calls)
    assert worst <= 1 + 1e-6
    assert worst > 0.5  # the neighbours do move mixtures


def test_declared_standardisation_keeps_2c_over_ell() -> None:
    """z-scored features have free signs: antipodal records are 2C apart, and the declared
    sensitivity is 2C/ℓ, reached."""
    n, d = 20, 6
    X = np.full((n, d), 0.5)
    X_prime = X.copy()
    X[0, :3], X_prime[0, :3] = 1.0, 0.0  # ±1 after z-scoring: antipodal
    labels = np.array([0] * 10 + [1] * 10)
    params = {
        **PARAMS,
        "standardization": "declared",
        "feature_mean": [0.5] * d,
        "feature_std": [0.5] * d,
    }
    first, _ = _release_rows(X, labels, params, 0.0, 1.0)
    second, _ = _release_rows(X_prime, labels, params, 0.0, 1.0)
    moved, declared = _moved(first, second)
    assert declared == pytest.approx(2 * 1.5 / 4, rel=1e-12)
    assert moved == pytest.approx(declared, rel=1e-6)


def test_generator_refuses_negative_features_when_promised_nonnegative() -> None:
    features = torch.eye(6, dtype=torch.float64)
    features[2, 0] = -1e-30
    with pytest.raises(ValueError, match="non-negative"):
        next(
            generate(
                features,
                torch.tensor([0, 0, 0, 1, 1, 1]),
                n_classes=2,
                mixture_degree=2,
                n_samples=4,
                sigma=1.0,
                clip_norm=1.0,
                nonnegative=True,
                generator=SecureRandom.from_seed(0),
            )
        )


# --- run time and progress by public sizes only ------------------------------------------------


class _Counting(SecureRandom):
    """A seeded stream that records how many bytes each draw takes."""

    def __init__(self, *, key: bytes | None = None) -> None:
        super().__init__(key=key)
        self.draws: list[int] = []

    def fill(self, out: np.ndarray) -> np.ndarray:
        self.draws.append(out.nbytes)
        return super().fill(out)


def _trace(labels: list[int], ell: int = 3, T: int = 27000) -> tuple[list, list]:  # type: ignore[type-arg]
    """Chunk shapes the runner would count as progress, and the bytes of every draw."""
    n = len(labels)
    generator = _Counting.from_seed(11)
    assert isinstance(generator, _Counting)
    shapes = [
        (tuple(x.shape), tuple(y.shape))
        for x, y in generate(
            torch.rand((n, 4), generator=torch.Generator().manual_seed(1)),
            torch.tensor(labels),
            n_classes=3,
            mixture_degree=ell,
            n_samples=T,
            sigma=0.5,
            clip_norm=1.0,
            nonnegative=True,
            generator=generator,
        )
    ]
    return shapes, generator.draws


def test_work_and_progress_do_not_depend_on_class_sizes() -> None:
    """Same n, K, ℓ, T; class sizes 5/5/90 against 40/30/30 (and rejection-prone tiny
    classes): the same chunks in the same order, and exactly the same randomness consumed
    (the same draws of the same sizes, noise included), so neither progress nor run time
    tells them apart. The previous sampler (rejection, sorting by class size) failed this."""
    small = [0] * 5 + [1] * 5 + [2] * 90
    even = [0] * 40 + [1] * 30 + [2] * 30
    tight = [0] * 3 + [1] * 3 + [2] * 94
    assert _trace(small) == _trace(even) == _trace(tight)
    assert len(_trace(small)[0]) > 3  # several chunks per class were compared


def test_floyd_subsets_are_uniform_and_distinct() -> None:
    from dpcore.mechanisms.sampling import floyd_subsets

    out = floyd_subsets(7, 3, 70_000, generator=SecureRandom.from_seed(2), device=None)  # type: ignore[arg-type]
    assert all(len(set(row)) == 3 for row in out.tolist()[:5000])
    seen = [tuple(sorted(row)) for row in out.tolist()]
    _, counts = np.unique(seen, axis=0, return_counts=True)
    assert len(counts) == 35
    assert stats.chisquare(counts).pvalue > 1e-4
    with pytest.raises(ValueError, match="subset size"):
        floyd_subsets(2, 3, 1, generator=SecureRandom.from_seed(0), device=None)  # type: ignore[arg-type]


def _floyd_scan(n: int, size: int, count: int, generator: SecureRandom) -> np.ndarray:
    """Floyd's algorithm as written (the O(ℓ²) membership scan): the reference."""
    out = np.empty((count, size), dtype=np.int64)
    for i, j in enumerate(range(n - size, n)):
        t = generator.integers(j + 1, count)
        taken = (out[:, :i] == t[:, None]).any(axis=1)
        out[:, i] = np.where(taken, j, t)
    return out


@pytest.mark.parametrize(
    ("n", "size"),
    [(1, 1), (2, 2), (7, 3), (7, 7), (9, 8), (40, 39), (40, 20), (300, 256), (60_000, 256)],
)
def test_floyd_equals_the_scan_draw_for_draw(n: int, size: int) -> None:
    # Same stream, same draws, same output: the chain-resolved membership test is the scan's
    # (ℓ close to n makes long chains t_i = j_k with t_k taken, which the doubling resolves).
    from dpcore.mechanisms.sampling import floyd_indices

    count = 2_000 if n < 60_000 else 100
    fast = floyd_indices(n, size, count, generator=SecureRandom.from_seed(n + size))
    assert (fast == _floyd_scan(n, size, count, SecureRandom.from_seed(n + size))).all()


class _Script(SecureRandom):
    def __init__(self, draws: list[int]) -> None:
        super().__init__(key=bytes(32))
        self.draws = draws

    def integers(self, high: int, shape: int | tuple[int, ...]) -> np.ndarray:
        value = self.draws.pop(0)
        assert 0 <= value < high
        return np.array([value], dtype=np.int64)


def test_floyd_long_chain() -> None:
    # n = ℓ = 6 (j_i = i): t = 0, 0, 1, 2, 3, 4. t_1 = 0 repeats t_0 → 1; t_2 = 1 = j_1 taken
    # via the chain → 2; …; every later t_i = j_{i−1} → j_i: a chain of length 5.
    from dpcore.mechanisms.sampling import floyd_indices

    draws = [0, 0, 1, 2, 3, 4]
    out = floyd_indices(6, 6, 1, generator=_Script(list(draws)))
    assert (
        out.tolist() == _floyd_scan(6, 6, 1, _Script(list(draws))).tolist() == [[0, 1, 2, 3, 4, 5]]
    )
    draws = [0, 1, 0, 2, 1, 3]  # t_2 = 0 repeats t_0 → 2; t_4 = 1 repeats t_1 → 4; t_5 = 3 → 3
    out = floyd_indices(6, 6, 1, generator=_Script(list(draws)))
    assert out.tolist() == _floyd_scan(6, 6, 1, _Script(list(draws))).tolist()
    assert sorted(out[0].tolist()) == list(range(6))


def test_floyd_work_does_not_depend_on_n() -> None:
    # ℓ draws per subset, requested as ℓ calls of `count` words, whatever n.
    from dpcore.mechanisms.sampling import floyd_indices

    class Calls(SecureRandom):
        def __init__(self) -> None:
            super().__init__(key=bytes(32))
            self.sizes: list[int | tuple[int, ...]] = []

        def integers(self, high: int, shape: int | tuple[int, ...]) -> np.ndarray:
            self.sizes.append(shape)
            return super().integers(high, shape)

    seen = []
    for n in (20, 21, 500, 60_000):
        source = Calls()
        floyd_indices(n, 16, 30, generator=source)
        seen.append(source.sizes)
    assert all(s == [30] * 16 for s in seen)


def test_each_mixture_sums_its_members_in_dataset_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks within a class shift on a neighbour where a record moved between classes; a
    mixture without that record must still be summed in the same order (the secure sampler's
    cover assumes its bits unchanged), so members are summed in dataset order."""
    from dpcore.mechanisms.dpcda import generate as module

    seen: list[torch.Tensor] = []
    real = module.gather_sum

    def recording(features: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        seen.append(chosen.clone())
        return real(features, chosen)

    monkeypatch.setattr(module, "gather_sum", recording)
    labels = [0, 1] * 20 + [2] * 15
    _run(labels, ell=5, T=60)
    assert seen
    for chosen in seen:
        assert (chosen[:, 1:] > chosen[:, :-1]).all()
