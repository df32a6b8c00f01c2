"""The secure stream and noise computed in torch (the CUDA path), run here on the CPU: the same
bytes as OpenSSL's ChaCha20, the same draws as ``RoundedGaussian.draw`` and the same noisy
values and stream position as ``SecureNoise``'s CPU path (tests/unit/test_cuda_paths.py runs
them on a GPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dpcore.mechanisms import chacha, device_draws, rounded_gaussian, secure_random
from dpcore.mechanisms.noise import BLOCK, SecureNoise
from dpcore.mechanisms.rounded_gaussian import RoundedGaussian
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from tests.unit import test_cuda_paths as cuda_paths


def _openssl(key: bytes, nonce: bytes, offset: int, size: int) -> bytes:
    counter = (offset // 64).to_bytes(4, "little")
    encryptor = Cipher(algorithms.ChaCha20(key, counter + nonce), mode=None).encryptor()
    return encryptor.update(bytes(offset % 64 + size))[offset % 64 :]


def test_the_block_function_matches_rfc_8439() -> None:
    # RFC 8439 §2.3.2: key 00 01 … 1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1.
    block = chacha.blocks(bytes(range(32)), bytes.fromhex("000000090000004a00000000"), 1, 1)
    assert [int(w) for w in block[0]] == [
        0xE4E7F110, 0x15593BD1, 0x1FDD0F50, 0xC47120A3, 0xC7F4D1C7, 0x0368C033, 0x9AAA2204,
        0x4E6CD4C3, 0x466482D2, 0x09AA9F07, 0x05D7C214, 0xA2028BD9, 0xD19C12B5, 0xB94E16DE,
        0xE883D0CB, 0x4E3C50A2,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("offset", "size"), [(0, 64), (0, 1), (13, 77), (64 * 5 + 3, 4096), (100_003, 70_001)]
)
def test_the_torch_keystream_is_openssls(offset: int, size: int) -> None:
    key, nonce = os.urandom(32), os.urandom(12)
    got = chacha.keystream(key, nonce, offset, size).numpy().tobytes()
    assert got == _openssl(key, nonce, offset, size)


def test_the_block_counter_never_wraps() -> None:
    with pytest.raises(ValueError, match="wrap"):
        chacha.blocks(bytes(32), bytes(12), (1 << 32) - 1, 2)


def test_device_words_continue_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small segments, so the reads below cross several of them (a fresh nonce each).
    monkeypatch.setattr(secure_random, "SEGMENT_BYTES", 1000)
    a, b = SecureRandom.from_seed(3), SecureRandom.from_seed(3)
    for count in (5, 37, 300, 1):
        got = a.device_words(count, "cpu")
        assert torch.equal(got, torch.from_numpy(b.words(count).view(np.int64)))
        assert a.bytes(3) == b.bytes(3)  # OpenSSL resumes where the words ended
    pairs = a.device_words((4, 5), "cpu", torch.int32)
    assert torch.equal(pairs, torch.from_numpy(b.fill(np.empty((4, 5), dtype=np.int32))))
    assert a.position == b.position


def test_rewind_gives_back_only_the_unused_tail_of_the_latest_device_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(secure_random, "SEGMENT_BYTES", 1000)
    reference = SecureRandom.from_seed(4).bytes(2600)
    for given_back in (0, 3, 999, 1000, 1999, 2500):
        source = SecureRandom.from_seed(4)
        source.bytes(100)  # a CPU read first: the device read starts mid-stream
        read = source.device_words(300, "cpu")  # bytes 100 … 2500, across segments
        assert read.numpy().tobytes() == reference[100:2500]
        position = max(100, given_back)
        source.rewind(position)
        assert source.position == position
        assert source.bytes(2600 - position) == reference[position:]
        # Those bytes are now used: nothing can be given back again.
        with pytest.raises(ValueError, match="latest device_words read"):
            source.rewind(position)
    source = SecureRandom.from_seed(4)
    source.device_words(10, "cpu")
    with pytest.raises(ValueError, match="latest device_words read"):
        source.rewind(source.position + 1)  # forward
    source.bytes(1)
    with pytest.raises(ValueError, match="latest device_words read"):
        source.rewind(0)  # after another read


def _hard_words(sampler: RoundedGaussian, rng: np.random.Generator) -> np.ndarray:
    """Random words, words in marked and crowded guide buckets, and words within E + 1 of
    table entries (the undecided band and its edges), with random signs."""
    table = sampler.table
    bits = table.guide_bits
    width = 1 << (63 - bits)
    buckets = np.arange(1 << bits)
    words = [rng.integers(0, 2**63, 20_000, dtype=np.uint64)]
    for chosen in (
        buckets[table.guide[: 1 << bits] == rounded_gaussian.GUIDE_MARK],
        buckets[table.lowest < 0],
    ):
        if chosen.size:
            picked = rng.choice(chosen, 3_000).astype(np.uint64)
            words.append(
                picked * np.uint64(width) + rng.integers(0, width, picked.size, dtype=np.uint64)
            )
    error = rounded_gaussian.TABLE_ERROR
    near = [
        int(table.entries[k]) + d
        for k in rng.integers(0, sampler.size, 100)
        for d in (-error - 1, -error, 0, error - 1, error, error + 1)
    ]
    words.append(np.array([h for h in near if 0 <= h < 2**63], dtype=np.uint64))
    heads = np.concatenate(words)
    return heads | (rng.integers(0, 2, heads.size, dtype=np.uint64) << np.uint64(63))


@pytest.mark.parametrize("scale", [0.3, 2.5, 300.0, 8807.0])
def test_table_draws_on_torch_are_the_table_draws(scale: float) -> None:
    sampler = RoundedGaussian(scale)
    words = _hard_words(sampler, np.random.default_rng(int(scale * 10)))
    cpu_source, torch_source = SecureRandom.from_seed(1), SecureRandom.from_seed(1)
    expected = sampler.draw(words, cpu_source.bytes)
    draws = device_draws.table_draws(sampler, torch.from_numpy(words.view(np.int64)))
    assert draws.undecided.size  # the words near the entries are undecided by the head
    got = device_draws.finish(sampler, draws, torch_source.bytes)
    assert np.array_equal(got.numpy(), expected.astype(np.int64))
    # The undecided draws read the same further words, in the same order.
    assert cpu_source.position == torch_source.position > 0


@pytest.mark.parametrize("error_bits", [10, 38])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("span_blocks", [1, 64])
def test_secure_noise_on_torch_is_the_cpu_paths(
    monkeypatch: pytest.MonkeyPatch, error_bits: int, dtype: torch.dtype, span_blocks: int
) -> None:
    # A wider undecided band (2³⁸, as if the table were coarser) makes several blocks hold
    # undecided draws, whose further words come between two blocks' words in the stream; one
    # block's words at a time, or all of them at once.
    monkeypatch.setattr(device_draws, "SPAN_BLOCKS", span_blocks)
    error = 1 << error_bits
    monkeypatch.setattr(rounded_gaussian, "TABLE_ERROR", error)
    monkeypatch.setattr(device_draws, "TABLE_ERROR", error)
    rounded_gaussian._table.cache_clear()
    device_draws._device_table.cache_clear()
    exact = RoundedGaussian.exact_magnitude
    calls: list[int] = []

    def counted(self: RoundedGaussian, head: int, start: int, random_bytes: object) -> int:
        calls.append(head)
        return exact(self, head, start, random_bytes)  # type: ignore[arg-type]

    monkeypatch.setattr(RoundedGaussian, "exact_magnitude", counted)
    values = torch.rand((3 * BLOCK + 123) // 7, 7, generator=torch.Generator().manual_seed(0))
    values = values.to(dtype)
    cpu = SecureNoise(SecureRandom.from_seed(7))
    on_torch = SecureNoise(SecureRandom.from_seed(7), on_device=True)
    try:
        expected = cpu(values, sigma=0.3, sensitivity=1.0)
        undecided = len(calls)
        got = on_torch(values, sigma=0.3, sensitivity=1.0)
    finally:
        rounded_gaussian._table.cache_clear()
        device_draws._device_table.cache_clear()
    assert got.dtype == dtype and torch.equal(got, expected)
    assert cpu.source is not None and on_torch.source is not None
    assert cpu.source.position == on_torch.source.position
    assert len(calls) == 2 * undecided
    if error_bits > 10:
        assert undecided >= 4


@pytest.mark.parametrize(
    "case", ["clustmix_dp", "clustmix_paper", "dpmix", "dpcda", "sgdrm", "dpgm_vae"]
)
def test_releases_noised_by_the_torch_path_are_the_cpu_paths(case: str) -> None:
    """Whole releases through the worker's ``build`` (tests/unit/test_cuda_paths.py's cases), on
    the CPU, once with the CPU path's noise and once with the CUDA path's code: the same rows,
    bit for bit, and the same stream position at the end."""
    mechanism, params, sigma, accountant, _ = cuda_paths.CASES[case]
    data = cuda_paths._toy()
    noise_scales = noise_for(mechanism, params, facts_of(data), sigma=sigma, accountant=accountant)
    releases, positions = [], []
    for on_device in (False, True):
        generator = SecureRandom.from_seed(5)
        out = build(
            mechanism,
            params,
            data,
            noise=noise_scales,
            sampler=SecureNoise(generator, on_device=on_device),
            generator=generator,
            device=torch.device("cpu"),
        )
        releases.append(list(out.chunks))
        positions.append(generator.position)
    assert positions[0] == positions[1]
    assert len(releases[0]) == len(releases[1]) > 0
    for (x, y), (x_torch, y_torch) in zip(*releases, strict=True):
        assert torch.equal(x, x_torch) and torch.equal(y, y_torch)
