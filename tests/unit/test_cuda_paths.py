"""The release generators on CUDA: ClustMix (variants dp and paper), DPMix, DP-CDA, SGDRM and DPGM
build a release of a small dataset on ``cuda`` through ``dpcore.mechanisms.run.build`` (the
worker's path) with the service's samplers, and every released chunk is computed there, of the
promised shape, finite. With the same secure stream, a release on cuda matches the same
release on cpu up to float rounding; the secure stream's words, uniforms, normals and lattice
noise computed on cuda are the CPU's exactly.

Skipped where torch sees no CUDA device (CI); run on a GPU machine with
``pytest -p no:cacheprovider --noconftest tests/unit/test_cuda_paths.py`` (bench/gpu.py's
results page says how)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms.noise import BLOCK, SecureNoise
from dpcore.mechanisms.noise import sampler as noise_sampler
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset
from tests.datasets import unit_dataset

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
CPU = torch.device("cpu")
CLASSES = 3


def _toy(sizes: tuple[int, ...] = (90, 70, 60), d: int = 6) -> ParsedDataset:
    """One bright feature per class (as tests/unit/test_clustmix_paper.py's toy)."""
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    X = rng.uniform(0, 1, (len(labels), d)) * 0.3
    X[np.arange(len(labels)), labels] += 0.7
    return unit_dataset(X, labels, len(sizes))


# (mechanism, params, calibrated σ, accountant, rows expected)
CASES: dict[str, tuple[str, dict[str, Any], float, str, int]] = {
    "clustmix_dp": (
        "clustmix",
        {"clusters_per_class": 2, "kmeans_refine": 1, "n_samples": 101},
        0.5,
        "tight",
        101,
    ),
    "clustmix_rff": (
        "clustmix",
        {"clusters_per_class": 2, "feature_map": "rff", "rff_frequencies": 16, "n_samples": 50},
        0.5,
        "tight",
        50,
    ),
    "clustmix_dpkip": (
        "clustmix",
        {"clusters_per_class": 2, "dpkip_steps": 3, "dpkip_batch": 40, "n_samples": 50},
        0.5,
        "tight",
        50,
    ),
    "clustmix_paper": (
        "clustmix",
        {"variant": "paper", "cluster_size": 20, "slice_rows": 40, "kip_steps": 20},
        0.3,
        "paper",
        # Class 0 (90): 2 regions of 45, 2 clusters each; class 1 (70): 2 of 35, 1 each;
        # class 2 (60): 2 of 30, 1 each.
        8,
    ),
    "dpmix": ("dpmix", {"mixture_degree": 4, "n_samples": 50}, 0.5, "tight", 50),
    "dpcda": (
        "dpcda",
        {"mixture_degree": 4, "n_samples": 60, "min_class_size": 60},
        0.5,
        "tight",
        60,
    ),
    "sgdrm": ("sgdrm", {"mixture_width": 8, "n_samples": 40}, 0.5, "tight", 40),
    "dpgm_vae": (
        "dpgm",
        {"epochs": 2, "batch_size": 40, "hidden": 16, "n_samples": 70, "weights": True},
        1.0,
        "tight",
        70,
    ),
    "dpgm_vae_kmeans": (
        "dpgm",
        {"epochs": 1, "batch_size": 40, "hidden": 16, "clusters_per_class": 2, "n_samples": 50},
        1.0,
        "tight",
        50,
    ),
    "dpgm_rbm": (
        "dpgm",
        {"model": "rbm", "epochs": 1, "batch_size": 40, "hidden": 16, "n_samples": 30},
        1.0,
        "tight",
        30,
    ),
}
# DP-SGD over many steps amplifies float rounding (a DPNorm mode can flip): DPGM's cuda run is
# checked for where it computes, not for agreement with the cpu run.
AGREEING = [case for case in CASES if not case.startswith("dpgm")]


def _release(
    case: str, device: torch.device, sampler: str, seed: int = 4
) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
    mechanism, params, sigma, accountant, _ = CASES[case]
    data = _toy()
    noise = noise_for(mechanism, params, facts_of(data), sigma=sigma, accountant=accountant)
    generator = SecureRandom.from_seed(seed)
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=noise_sampler(sampler, generator),
        generator=generator,
        device=device,
    )
    return out, list(out.chunks)


@pytest.mark.parametrize("sampler", ["secure", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_release_is_computed_on_cuda(case: str, sampler: str) -> None:
    out, chunks = _release(case, CUDA, sampler)
    rows = CASES[case][4]
    assert chunks, "no rows released"
    for x, y in chunks:
        assert x.device.type == "cuda" and y.device.type == "cuda"
        assert x.dtype == torch.float32 and y.dtype == torch.float32
        assert torch.isfinite(x).all() and torch.isfinite(y).all()
    X = torch.cat([x for x, _ in chunks])
    Y = torch.cat([y for _, y in chunks])
    assert X.shape == (rows, 6) and Y.shape == (rows, CLASSES)
    assert out.rows == rows and len(out.feature_names) == 6


@pytest.mark.parametrize("case", AGREEING)
def test_cuda_and_cpu_agree_on_the_same_stream(case: str) -> None:
    """Same key, same bytes: the subsets, coefficients and noise are the same draws; only
    float rounding differs between the devices."""
    _, on_cuda = _release(case, CUDA, "fast")
    _, on_cpu = _release(case, CPU, "fast")
    X_cuda = torch.cat([x for x, _ in on_cuda]).cpu().double()
    X_cpu = torch.cat([x for x, _ in on_cpu]).double()
    Y_cuda = torch.cat([y for _, y in on_cuda]).cpu().double()
    Y_cpu = torch.cat([y for _, y in on_cpu]).double()
    assert X_cuda.shape == X_cpu.shape and Y_cuda.shape == Y_cpu.shape
    torch.testing.assert_close(X_cuda, X_cpu, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(Y_cuda, Y_cpu, atol=1e-4, rtol=1e-4)


def test_the_stream_on_cuda_is_the_cpus() -> None:
    on_cuda, on_cpu = SecureRandom.from_seed(21), SecureRandom.from_seed(21)
    words = on_cuda.device_words(100_003, CUDA)
    assert words.device.type == "cuda"
    assert torch.equal(words.cpu(), torch.from_numpy(on_cpu.words(100_003).view(np.int64)))
    u = on_cuda.uniform((3, 1001), device=CUDA)
    assert u.device.type == "cuda" and torch.equal(u.cpu(), on_cpu.uniform((3, 1001)))
    z = on_cuda.normal((5, 777), device=CUDA)
    torch.testing.assert_close(z.cpu(), on_cpu.normal((5, 777)), atol=1e-12, rtol=1e-12)
    assert on_cuda.position == on_cpu.position


@pytest.mark.parametrize("sigma", [0.05, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_noise_on_cuda_is_the_cpus(sigma: float, dtype: torch.dtype) -> None:
    values = torch.rand((2 * BLOCK + 77) // 11, 11, generator=torch.Generator().manual_seed(3))
    values = values.to(dtype)
    on_cuda = SecureNoise(SecureRandom.from_seed(8))
    on_cpu = SecureNoise(SecureRandom.from_seed(8))
    got = on_cuda(values.to(CUDA), sigma=sigma, sensitivity=1.0)
    assert got.device.type == "cuda" and got.dtype == dtype
    assert torch.equal(got.cpu(), on_cpu(values, sigma=sigma, sensitivity=1.0))
    assert on_cuda.source is not None and on_cpu.source is not None
    assert on_cuda.source.position == on_cpu.source.position


def test_group_sums_on_cuda_do_not_depend_on_scheduling() -> None:
    """Many rows per group, float64 values whose sum depends on the order of addition: the
    same input gives the same bits every time, and a group none of whose rows changed keeps
    its bits when another row moves to another group (segments module docstring)."""
    from dpcore.mechanisms import segments

    gen = torch.Generator().manual_seed(5)
    values = (torch.rand((200_000, 4), generator=gen, dtype=torch.float64) * 1e3).to(CUDA)
    index = torch.randint(0, 6, (200_000,), generator=gen).to(CUDA)

    def sums(idx: torch.Tensor) -> torch.Tensor:
        return segments.segment_sum(
            torch.zeros((6, 4), dtype=torch.float64, device=CUDA), idx, values
        ).cpu()

    first = sums(index)
    for _ in range(10):
        assert torch.equal(sums(index), first)
    moved = index.clone()
    moved[17] = (int(index[17]) + 1) % 6
    changed = {int(index[17]), int(moved[17])}
    other = sums(moved)
    for g in range(6):
        if g not in changed:
            assert torch.equal(other[g], first[g])
