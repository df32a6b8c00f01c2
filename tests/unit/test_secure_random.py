"""dpcore.mechanisms.secure_random: the keystream, its exact laws, and that releases use it
(and only it, with a fresh OS key) for every random choice."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from dpcore.mechanisms import registry, secure_random
from dpcore.mechanisms.run import build, facts_of, noise_for, randomness
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset

N = 200_000


def test_keystream_is_chacha20_across_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secure_random, "SEGMENT_BYTES", 100)
    key = bytes(range(32))
    source = SecureRandom(key=key)
    got = source.bytes(70) + source.bytes(70) + source.bytes(160)  # three segments
    expected = b"".join(
        Cipher(algorithms.ChaCha20(key, bytes(4) + s.to_bytes(12, "little")), None)
        .encryptor()
        .update(bytes(100))
        for s in range(3)
    )
    assert got == expected


def test_seeded_streams_reproduce_and_fresh_ones_differ() -> None:
    assert SecureRandom.from_seed(1).bytes(64) == SecureRandom.from_seed(1).bytes(64)
    assert SecureRandom.from_seed(1).bytes(64) != SecureRandom.from_seed(2).bytes(64)
    assert SecureRandom().bytes(64) != SecureRandom().bytes(64)
    with pytest.raises(ValueError):
        SecureRandom(key=bytes(16))  # 256-bit keys only


def test_release_randomness_draws_a_fresh_os_key(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    real = secure_random.secrets.token_bytes

    def token_bytes(count: int) -> bytes:
        asked.append(count)
        return real(count)

    monkeypatch.setattr(secure_random.secrets, "token_bytes", token_bytes)
    first, second = randomness("secure")[0], randomness("fast")[0]
    assert asked == [32, 32]
    assert first.bytes(32) != second.bytes(32)


def test_worker_uses_the_release_randomness() -> None:
    import inspect

    from worker import writing

    assert writing.randomness is randomness
    source = inspect.getsource(writing.write_release)
    assert "randomness(job.noise_sampler)" in source
    assert "Generator" not in source and "from_seed" not in source and "key=" not in source


def test_integers_have_no_modulo_bias() -> None:
    # high = 3·2³⁰: with plain `word % high`, [0, 2³⁰) would get two preimages of 2³² and be
    # hit half the time instead of a third.
    values = SecureRandom.from_seed(4).integers(3 * 2**30, N)
    assert values.min() >= 0 and values.max() < 3 * 2**30
    share = (values < 2**30).mean()
    assert abs(share - 1 / 3) < 5 * math.sqrt(2 / 9 / N)
    small = SecureRandom.from_seed(5).integers(7, N)
    assert stats.chisquare(np.bincount(small, minlength=7)).pvalue > 1e-4
    big = SecureRandom.from_seed(6).integers(2**40 + 3, 1000)
    assert big.max() < 2**40 + 3 and big.max() > 2**39


def test_bernoulli_rate_is_exact() -> None:
    hits = SecureRandom.from_seed(7).bernoulli(3, 7, (N,))
    assert abs(hits.mean() - 3 / 7) < 5 * math.sqrt(3 / 7 * 4 / 7 / N)
    assert SecureRandom.from_seed(7).bernoulli(0, 7, (100,)).sum() == 0
    assert SecureRandom.from_seed(7).bernoulli(7, 7, (100,)).all()


def test_uniform_has_53_bits() -> None:
    u = SecureRandom.from_seed(8).uniform((N,))
    assert u.dtype == torch.float64
    assert u.min().item() >= 0 and u.max().item() < 1
    k = u * 2.0**53
    assert torch.equal(k, k.floor())  # multiples of 2⁻⁵³
    assert (k.to(torch.int64) & 1).double().mean().item() == pytest.approx(0.5, abs=0.01)
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4
    opened = SecureRandom.from_seed(8).uniform((N,), open_zero=True)
    assert opened.min().item() > 0 and opened.max().item() <= 1


def test_normal_is_standard_normal_on_the_device() -> None:
    z = SecureRandom.from_seed(9).normal((N // 2, 2), device=torch.device("cpu"))
    assert z.shape == (N // 2, 2) and z.dtype == torch.float64
    assert stats.kstest(z.flatten().numpy(), "norm").pvalue > 1e-4
    odd = SecureRandom.from_seed(9).normal((3,), dtype=torch.float32)
    assert odd.shape == (3,) and odd.dtype == torch.float32


def test_keys_cover_the_int32_range() -> None:
    keys = SecureRandom.from_seed(10).keys((N,))
    assert keys.dtype == torch.int32
    assert (keys < 0).double().mean().item() == pytest.approx(0.5, abs=0.01)


# --- the production code path draws nothing from torch's generators -----------------------

_TORCH_RNG = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial")


def _parsed(n: int = 40, d: int = 3) -> ParsedDataset:
    rng = np.random.default_rng(0)
    return ParsedDataset(
        X=rng.uniform(size=(n, d)),
        feature_shape=(d,),
        feature_names=[f"f{i}" for i in range(d)],
        labels=np.arange(n) % 2,
        classes=[0, 1],
        classes_declared=True,
        lo=np.zeros(d),
        hi=np.ones(d),
        clipped_values=0,
    )


CASES: list[tuple[str, dict[str, Any]]] = [
    ("dpmix", {"mixture_degree": 4, "n_samples": 50}),
    ("dpmix", {"mixture_degree": 4, "n_samples": 50, "assignment": "record"}),
    ("dpmix", {"mixture_degree": 30, "n_samples": 50}),  # the sort-key path
    ("sgdrm", {"mixture_width": 4, "n_samples": 50, "coefficient_bound": 0.3}),
    ("local_perturbation", {}),
    ("random_projection", {"projection_dim": 2, "spectral_norm": 1.5}),
    (
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 50,
            "min_class_size": 4,
            "standardization": "declared",
            "feature_mean": [0.5, 0.5, 0.5],
            "feature_std": [0.5, 0.5, 0.5],
        },
    ),
]


@pytest.mark.parametrize("noise_sampler", ["secure", "fast"])
@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_releases_draw_only_from_the_secure_source(
    monkeypatch: pytest.MonkeyPatch, mechanism: str, params: dict[str, Any], noise_sampler: str
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a release drew from torch's generator")

    for name in _TORCH_RNG:
        monkeypatch.setattr(torch, name, forbidden)
    monkeypatch.setattr(torch, "Generator", forbidden)
    monkeypatch.setattr(torch.Tensor, "random_", forbidden)
    monkeypatch.setattr(torch.Tensor, "uniform_", forbidden)
    monkeypatch.setattr(torch.Tensor, "normal_", forbidden)
    drawn: list[int] = []
    real_fill = SecureRandom.fill

    def fill(self: SecureRandom, out: np.ndarray) -> np.ndarray:
        drawn.append(out.nbytes)
        return real_fill(self, out)

    monkeypatch.setattr(SecureRandom, "fill", fill)
    data = _parsed()
    two_scales = "sigma_y" in registry.accountant(mechanism, "tight").key_names
    noise = noise_for(
        mechanism, params, facts_of(data), sigma=0.5, sigma_y=0.5 if two_scales else None
    )
    generator, sampler = randomness(noise_sampler)
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=sampler,
        generator=generator,
        device=torch.device("cpu"),
    )
    rows = sum(x.shape[0] for x, _ in out.chunks)
    assert rows == out.rows
    assert sum(drawn) > 0


def test_build_refuses_a_torch_generator() -> None:
    data = _parsed()
    noise = noise_for("local_perturbation", {}, facts_of(data), sigma=0.5, sigma_y=0.5)
    _, sampler = randomness("fast")
    with pytest.raises(TypeError):
        build(
            "local_perturbation",
            {},
            data,
            noise=noise,
            sampler=sampler,
            generator=torch.Generator(),  # type: ignore[arg-type]
            device=torch.device("cpu"),
        )
