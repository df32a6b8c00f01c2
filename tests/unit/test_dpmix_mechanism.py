"""dpcore.mechanisms.dpmix.generate: chunking, exact mixtures, noise scale, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpcore.mechanisms import sampling
from dpcore.mechanisms.dpmix.generate import chunk_size, generate
from dpcore.mechanisms.secure_random import SecureRandom

CPU = torch.device("cpu")


def gen(seed: int = 0) -> SecureRandom:
    return SecureRandom.from_seed(seed)


def identity_data(
    n: int, k: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features = identity rows (a mixture reveals its subset); labels one-hot of i mod k."""
    features = torch.eye(n, dtype=dtype)
    labels = torch.nn.functional.one_hot(torch.arange(n) % k, k).to(dtype)
    return features, labels


def test_chunks_cover_n_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    n, k, ell = 12, 3, 3
    # a chunk row holds ℓ indices, n sort keys (8ℓ > n: the keys path), its float64 output
    # (d + k) and one block partial sum (⌈3/64⌉ = 1 row of d + k, float32 and float64):
    # 3 + 12 + 15·3 = 60 entries; budget 7·60 → 7 per chunk
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 7 * (ell + n + 3 * (n + k)))
    assert chunk_size(mixture_degree=ell, dim=n + k, n=n) == 7
    features, labels = identity_data(n, k)
    chunks = list(
        generate(
            features,
            labels,
            mixture_degree=ell,
            n_samples=50,
            sigma_x=0.0,
            sigma_y=0.0,
            generator=gen(),
        )
    )
    assert [x.shape[0] for x, _ in chunks] == [7] * 7 + [1]
    for x, y in chunks:
        assert x.shape[1:] == (n,)
        assert y.shape == (x.shape[0], k)
    assert sum(x.shape[0] for x, _ in chunks) == 50


def test_key_regime_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    n, k, ell = 10, 2, 4  # 8ℓ > n and 8(n − ℓ) > n: the keys path, n keys per row
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 40)
    assert chunk_size(mixture_degree=ell, dim=n + k, n=n) == 1  # 40 // (4 + 10 + 36) → 1
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 100)
    # 4 indices + 10 keys + 2·(1 + 2·⌈4/64⌉) = 20 entries per row
    assert chunk_size(mixture_degree=ell, dim=2, n=n) == 5
    # distinct draws (8ℓ ≤ n): no keys, n plays no part
    assert chunk_size(mixture_degree=ell, dim=2, n=10**6) == 10
    assert chunk_size(mixture_degree=65, dim=2, n=100) == 1  # 65 + 100 + 2·5: 100 // 175
    ell = 6
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 5 * (ell + n + 3 * (n + k)))
    features, labels = identity_data(n, k)
    sizes = [
        x.shape[0]
        for x, _ in generate(
            features,
            labels,
            mixture_degree=ell,
            n_samples=123,
            sigma_x=0.0,
            sigma_y=0.0,
            generator=gen(),
        )
    ]
    assert sum(sizes) == 123
    assert len(sizes) > 1


def test_default_chunk_size_bounded() -> None:
    for ell, dim, n in [(64, 794, 60_000), (1, 3, 2), (300, 100, 1_000), (2, 10_000, 10)]:
        c = chunk_size(mixture_degree=ell, dim=dim, n=n)
        assert 1 <= c <= 4096
        keys = n if sampling.subset_path(n, ell) == "keys" else 0
        per_row = ell + keys + dim * (1 + 2 * -(-ell // sampling.SUM_BLOCK))
        assert c * per_row <= sampling.GATHER_BUDGET or c == 1


@pytest.mark.parametrize(("n", "ell"), [(12, 3), (10, 4), (7, 7), (30, 1)])
def test_noiseless_rows_are_means_of_distinct_records(
    monkeypatch: pytest.MonkeyPatch, n: int, ell: int
) -> None:
    k = 3
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 11 * ell * (n + k))  # several chunks
    features, labels = identity_data(n, k)
    rows = 0
    for x, y in generate(
        features,
        labels,
        mixture_degree=ell,
        n_samples=200,
        sigma_x=0.0,
        sigma_y=0.0,
        generator=gen(3),
    ):
        for mixed_x, mixed_y in zip(x, y, strict=True):
            members = torch.nonzero(mixed_x).flatten()
            assert members.numel() == ell  # ℓ distinct records
            assert torch.equal(mixed_x[members], torch.full((ell,), 1.0 / ell, dtype=x.dtype))
            # the labels are the mean over the same records
            assert torch.allclose(mixed_y, labels[members].mean(dim=0), rtol=0, atol=1e-15)
            rows += 1
    assert rows == 200


def test_subsets_vary_across_rows_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    n, k, ell = 12, 2, 3
    monkeypatch.setattr(sampling, "GATHER_BUDGET", 5 * ell * (n + k))
    features, labels = identity_data(n, k)
    x = torch.cat(
        [
            c
            for c, _ in generate(
                features,
                labels,
                mixture_degree=ell,
                n_samples=4_000,
                sigma_x=0.0,
                sigma_y=0.0,
                generator=gen(8),
            )
        ]
    )
    included = (x > 0).double().numpy()
    # every record is included at rate ℓ/n, and consecutive chunks are not copies
    assert np.abs(included.mean(axis=0) - ell / n).max() < 5 * np.sqrt(0.25 * 0.75 / 4_000)
    assert not torch.equal(x[:5], x[5:10])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_noise_scale(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    n, d, k = 300, 5, 4
    raw = rng.random((n, d))
    raw /= np.maximum(np.linalg.norm(raw, axis=1, keepdims=True), 1.0)
    features = torch.as_tensor(raw, dtype=dtype)
    labels = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, k, n)), k).to(dtype)
    sigma_x, sigma_y = 40.0, 7.0
    xs, ys = zip(
        *generate(
            features,
            labels,
            mixture_degree=10,
            n_samples=20_000,
            sigma_x=sigma_x,
            sigma_y=sigma_y,
            generator=gen(11),
        ),
        strict=True,
    )
    x = torch.cat(xs).double()
    y = torch.cat(ys).double()
    assert x.shape == (20_000, d)
    assert y.shape == (20_000, k)
    # mixtures vary by < 1 per coordinate: the spread is the noise
    assert x.std().item() == pytest.approx(sigma_x, rel=0.02)
    assert y.std().item() == pytest.approx(sigma_y, rel=0.02)
    # centred on the data: |mean| of noise over 100k values ~ σ/316
    assert (
        abs((x.mean(dim=0) - features.double().mean(dim=0)).abs().max().item()) < 5 * sigma_x / 140
    )
    # feature and label noise are independent
    assert abs(np.corrcoef(x[:, 0].numpy(), y[:, 0].numpy())[0, 1]) < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved(dtype: torch.dtype) -> None:
    features, labels = identity_data(8, 2, dtype)
    for x, y in generate(
        features,
        labels,
        mixture_degree=2,
        n_samples=10,
        sigma_x=0.5,
        sigma_y=0.5,
        generator=gen(),
    ):
        assert x.dtype == dtype
        assert y.dtype == dtype


def test_zero_samples_yield_nothing() -> None:
    features, labels = identity_data(8, 2)
    out = generate(
        features,
        labels,
        mixture_degree=2,
        n_samples=0,
        sigma_x=0.5,
        sigma_y=0.5,
        generator=gen(),
    )
    assert list(out) == []


def test_reproducible_with_same_seed() -> None:
    features, labels = identity_data(8, 2)

    def run(seed: int) -> torch.Tensor:
        return torch.cat(
            [
                x
                for x, _ in generate(
                    features,
                    labels,
                    mixture_degree=3,
                    n_samples=30,
                    sigma_x=0.1,
                    sigma_y=0.1,
                    generator=gen(seed),
                )
            ]
        )

    assert torch.equal(run(4), run(4))
    assert not torch.equal(run(4), run(5))


def test_mismatched_shapes() -> None:
    features = torch.zeros(5, 3)
    labels = torch.zeros(4, 2)
    with pytest.raises(ValueError):
        next(
            generate(
                features,
                labels,
                mixture_degree=2,
                n_samples=3,
                sigma_x=1.0,
                sigma_y=1.0,
                generator=gen(),
            )
        )


def test_mixture_degree_above_n() -> None:
    features, labels = identity_data(4, 2)
    with pytest.raises(ValueError):
        next(
            generate(
                features,
                labels,
                mixture_degree=5,
                n_samples=3,
                sigma_x=1.0,
                sigma_y=1.0,
                generator=gen(),
            )
        )
