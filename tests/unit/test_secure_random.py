"""dpcore.mechanisms.secure_random: the keystream, its exact laws, and that releases use it
(and only it, with a fresh OS key) for every random choice."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import random
import secrets
import sys
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from dpcore.marginals import records
from dpcore.mechanisms import registry, secure_random
from dpcore.mechanisms.dpgm import release as dpgm_release
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


class _ScriptedWords(SecureRandom):
    """Returns the given words in turn and records each request's (count, dtype)."""

    def __init__(self, *draws: list[int]) -> None:
        super().__init__(key=bytes(32))
        self.draws = list(draws)
        self.requests: list[tuple[int, type]] = []

    def words(self, count: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
        self.requests.append((count, dtype))
        return np.array(self.draws.pop(0), dtype=dtype)


# Past 2³² the integers come from 64-bit words. 2⁶⁴ mod high words are rejected: one (2⁶⁴ − 1)
# for the smallest such high, about 2³⁸ for 3·2³⁸ + 7, 50 for 2⁶³ − 25.
WIDE_HIGHS = [
    pytest.param(2**32 + 1, id="2^32+1"),
    pytest.param(3 * 2**38 + 7, id="3*2^38+7"),
    pytest.param(2**63 - 25, id="2^63-25"),
]


@pytest.mark.parametrize("high", WIDE_HIGHS)
def test_wide_integers_redraw_the_words_past_the_last_whole_multiple(high: int) -> None:
    # The law (secure_random.SecureRandom.integers): words at or past the largest multiple of
    # high below 2⁶⁴ are redrawn, only they, until none is; each kept word w gives w mod high.
    limit = 2**64 // high * high
    assert limit < 2**64  # none of these highs divides 2⁶⁴: some words must be redrawn
    source = _ScriptedWords([limit, 7, 2**64 - 1], [limit - 1, limit], [high + 4])
    assert source.integers(high, 3).tolist() == [high - 1, 7, 4]
    assert source.requests == [(3, np.uint64), (2, np.uint64), (1, np.uint64)]
    assert source.draws == []


@pytest.mark.parametrize("high", WIDE_HIGHS)
def test_wide_integers_are_the_words_mod_high(high: int) -> None:
    limit = 2**64 // high * high
    # Both ends of the first and the last whole block of high words, and words past 2³², 2⁶³.
    words = [0, 1, high - 1, high, limit - high, 2**32 + 9, 2**63 + 12_345, limit - 1]
    source = _ScriptedWords(words)
    got = source.integers(high, (2, 4))
    assert got.dtype == np.int64 and got.shape == (2, 4)
    assert got.flatten().tolist() == [w % high for w in words]
    assert source.requests == [(8, np.uint64)]  # none redrawn


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


# --- a release draws its random choices from the secure source and only from it -----------

_TORCH_DRAWS = (
    "rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
    "binomial", "rand_like", "randn_like", "randint_like", "_standard_gamma",
    "_sample_dirichlet", "dropout", "alpha_dropout", "feature_alpha_dropout", "rrelu",
    "seed", "manual_seed",
)  # fmt: skip
_TENSOR_DRAWS = (
    "random_", "uniform_", "normal_", "bernoulli_", "bernoulli", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "multinomial",
)  # fmt: skip
# Every name numpy.random exports draws from, seeds or builds a generator (the global
# RandomState's functions, the Generator and bit-generator classes, default_rng), except the
# global state's accessors.
_NUMPY_DRAWS = tuple(n for n in np.random.__all__ if n not in ("get_state", "set_state"))
_PYTHON_DRAWS = tuple(n for n in random.__all__ if n not in ("getstate", "setstate"))


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


# Cheap requests on _parsed's 40 × 3 records, one for each path that draws differently:
# (params, accountant or None for the mechanism's default, samplers). Every mechanism the
# registry serves must have at least one.
BOTH = ("secure", "fast")
RELEASES: dict[str, list[tuple[dict[str, Any], str | None, tuple[str, ...]]]] = {
    "dpmix": [
        ({"mixture_degree": 4, "n_samples": 50}, None, BOTH),
        ({"mixture_degree": 4, "n_samples": 50, "assignment": "record"}, None, BOTH),
        ({"mixture_degree": 30, "n_samples": 50}, None, BOTH),  # the sort-key path
    ],
    "sgdrm": [
        ({"mixture_width": 4, "n_samples": 50, "coefficient_bound": 0.3}, None, BOTH),
        ({"mixture_width": 4, "n_samples": 50, "coefficients": "gaussian"}, None, BOTH),
    ],
    "local_perturbation": [({}, None, BOTH)],
    "random_projection": [({"projection_dim": 2, "spectral_norm": 1.5}, None, BOTH)],
    "dpcda": [
        (
            {
                "mixture_degree": 4,
                "n_samples": 50,
                "min_class_size": 4,
                "standardization": "declared",
                "feature_mean": [0.5, 0.5, 0.5],
                "feature_std": [0.5, 0.5, 0.5],
            },
            None,
            BOTH,
        ),
        (
            {
                "mixture_degree": 4,
                "n_samples": 50,
                "min_class_size": 4,
                "class_sizes": "dp",
                "count_noise": 0.5,
            },
            None,
            BOTH,
        ),
    ],
    "clustmix": [
        ({"clusters_per_class": 2, "kmeans_refine": 1, "n_samples": 50}, None, BOTH),
        ({"clusters_per_class": 2, "feature_map": "rff", "rff_frequencies": 8}, None, BOTH),
        (
            {"clusters_per_class": 2, "dpkip_steps": 2, "dpkip_batch": 10, "n_samples": 30},
            None,
            BOTH,
        ),
        ({"model": "gaussian", "clusters_per_class": 2, "kmeans_refine": 1}, None, BOTH),
        (
            {"variant": "paper", "cluster_size": 10, "slice_rows": 20, "kip_steps": 2},
            "paper",
            BOTH,
        ),
    ],
    "dpgm": [
        ({"epochs": 1, "batch_size": 10, "hidden": 8, "n_samples": 30}, None, BOTH),
        ({"epochs": 1, "batch_size": 10, "hidden": 8, "clusters_per_class": 2}, None, BOTH),
        (
            {"model": "rbm", "epochs": 1, "batch_size": 10, "hidden": 8, "n_samples": 30},
            None,
            BOTH,
        ),
    ],
    # A marginal model's fit compiles in jax (seconds a release): each sampler once. Both
    # mechanisms hand their histograms to the sampler alike (dpcore.marginals.histograms).
    "mst": [
        ({"bins": 3, "iterations": 2, "n_samples": 30}, None, ("secure",)),
        ({"bins": 3, "iterations": 2, "n_samples": 30, "structure": "label"}, None, ("fast",)),
    ],
    "aim": [
        (
            {"bins": 3, "iterations": 2, "rounds": 8, "max_rounds": 1, "n_samples": 30},
            None,
            ("secure",),
        )
    ],
}


def _served_releases() -> list[Any]:
    """The cases of RELEASES for every mechanism the registry serves; a served mechanism
    without an entry gets a case that fails until one is written."""
    cases = []
    for spec in registry.served():
        entries = RELEASES.get(spec.name, [(None, None, ("secure",))])  # type: ignore[list-item]
        for i, (params, accountant, samplers) in enumerate(entries):
            for noise_sampler in samplers:
                cases.append(
                    pytest.param(
                        spec.name,
                        params,
                        accountant,
                        noise_sampler,
                        id=f"{spec.name}-{i}-{noise_sampler}",
                    )
                )
    return cases


# Modules releases import on first use (torch.optim's torch._dynamo, MST's and AIM's jax
# model), whose import-time code builds module-level generators (sympy's random.Random, jax's
# cluster probe's np.random): imported before the sources are blocked, as import is not a
# release's draw.
_IMPORTED_BY_RELEASES = ("torch._dynamo", "dpcore.marginals.model")


class _Drew(AssertionError):
    """A release drew randomness from a source other than its SecureRandom."""


class _StandIn(type):
    """The metaclass of a stand-in for a generator class: ``isinstance`` and ``issubclass``
    still see the real class; building one raises unless ``allowed(the caller's frame)``."""

    real: type
    what: str
    made: list[Any]

    def allowed(cls, frame: Any) -> bool:
        return False

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.real)

    def __call__(cls, *args: object, **kwargs: object) -> Any:
        if not cls.allowed(sys._getframe(1)):
            raise _Drew(f"a release built {cls.what}")
        made = cls.real(*args, **kwargs)
        cls.made.append(made)
        return made


def _stand_in(real: type, what: str, allowed: Any = None) -> Any:
    body: dict[str, Any] = {"real": real, "what": what, "made": []}
    if allowed is not None:
        body["allowed"] = classmethod(lambda cls, frame: allowed(frame))
    return _StandIn(real.__name__, (), body)


class _Streams:
    """Blocks every random source but the release's ``SecureRandom``, except the two streams
    docs/privacy.md declares public, which are let through only as they are made there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for imported in _IMPORTED_BY_RELEASES:
            importlib.import_module(imported)
        self.public_numpy = 0
        real_default_rng = np.random.default_rng

        # docs/privacy.md, "DPGM", "Mechanism as implemented": initial weights,
        # reparametrisation draws, Gibbs chains and sampling come from "a torch generator keyed
        # from the release's secure source" (DP-SGD's bound holds for every value of it). Only
        # dpgm.release.torch_generator, which seeds it from the SecureRandom, may build one;
        # only draws that name such a generator pass.
        self.torch_generator = _stand_in(
            torch.Generator,
            "a torch generator",
            lambda frame: frame.f_code is dpgm_release.torch_generator.__code__,
        )

        # docs/privacy.md, "MST" and "AIM", "Samplers": the post-processing draws (bins,
        # merged values, records) "use a generator seeded from the release's secure source".
        # Only dpcore.marginals.records.post_rng, which seeds it with SecureRandom words, may
        # build one, and never OS-seeded.
        def default_rng(seed: object = None) -> np.random.Generator:
            if sys._getframe(1).f_code is not records.post_rng.__code__ or seed is None:
                raise _Drew("a release built a numpy generator (default_rng)")
            self.public_numpy += 1
            return real_default_rng(seed)  # type: ignore[arg-type]

        def guard(what: str, real: Any = None) -> Any:
            def forbidden(*args: object, **kwargs: object) -> Any:
                named = kwargs.get("generator")
                if real is not None and any(named is g for g in self.torch_generator.made):
                    return real(*args, **kwargs)
                raise _Drew(f"a release drew from {what}")

            return forbidden

        for name in _TORCH_DRAWS:
            monkeypatch.setattr(torch, name, guard(f"torch.{name}", getattr(torch, name)))
        for name in _TENSOR_DRAWS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, guard(f"Tensor.{name}", real))
        for name in ("dropout", "alpha_dropout", "feature_alpha_dropout", "rrelu"):
            monkeypatch.setattr(torch.nn.functional, name, guard(f"F.{name}"))
        monkeypatch.setattr(torch, "Generator", self.torch_generator)
        for module, names in ((np.random, _NUMPY_DRAWS), (random, _PYTHON_DRAWS)):
            for name in names:
                what = f"{module.__name__}.{name}"
                real = getattr(module, name)
                blocked = _stand_in(real, what) if isinstance(real, type) else guard(what)
                monkeypatch.setattr(module, name, blocked)
        monkeypatch.setattr(np.random, "default_rng", default_rng)
        jax_random = importlib.import_module("jax.random")  # keyed explicitly, by public keys
        for name in dir(jax_random):
            if inspect.isfunction(getattr(jax_random, name)) and not name.startswith("_"):
                monkeypatch.setattr(jax_random, name, guard(f"jax.random.{name}"))
        for name in ("urandom", "getrandom"):
            monkeypatch.setattr(os, name, guard(f"os.{name}"))
        for name in ("token_bytes", "token_hex", "token_urlsafe", "randbits", "randbelow"):
            monkeypatch.setattr(secrets, name, guard(f"secrets.{name}"))
        # Draws that bypass the Python names above (C++ callers, imported aliases) still move
        # the global generators' states.
        self.states = self._global_states()

    @staticmethod
    def _global_states() -> tuple[Any, ...]:
        return (
            torch.random.default_generator.get_state(),
            np.random.mtrand._rand.get_state(legacy=False),
            random._inst.getstate(),  # type: ignore[attr-defined]
        )

    def untouched(self) -> bool:
        before, after = self.states, self._global_states()
        torch_state, numpy_state, python_state = before
        return (
            torch.equal(torch_state, after[0])
            and _same(numpy_state, after[1])
            and python_state == after[2]
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


@pytest.mark.parametrize(("mechanism", "params", "accountant", "noise_sampler"), _served_releases())
def test_releases_draw_only_from_the_secure_source(
    monkeypatch: pytest.MonkeyPatch,
    mechanism: str,
    params: dict[str, Any] | None,
    accountant: str | None,
    noise_sampler: str,
) -> None:
    """Every served mechanism (the registry's list), with the samplers of its RELEASES cases,
    builds a release and yields all its rows (``build``, the worker's call, and its chunks)
    with every other random source raising: torch's module functions, ``Tensor`` draws and
    generators; numpy's global functions, ``default_rng``, ``Generator``, ``RandomState`` and
    bit generators; Python's ``random``; ``jax.random``; ``os.urandom`` and ``secrets`` once
    the release's key is drawn. The global torch, numpy and ``random`` states must not move
    either (draws no patch sees). Allowed, as docs/privacy.md declares them public, and only
    as made there: DPGM's torch generator (``dpgm.release.torch_generator``) and MST's and
    AIM's numpy post-processing generator (``marginals.records.post_rng``), each seeded from
    the ``SecureRandom``.

    Not covered: after ``build`` the worker maps drawn rows into the declared domain with
    ``RowSteps.rng`` (``worker/writing.py``: numpy's OS-seeded PCG64, docs/privacy.md "Common
    model": uniforms independent of the data, which protect nothing)."""
    assert params is not None, f"{mechanism} is served: give it a case in RELEASES"
    drawn: list[int] = []
    real_fill = SecureRandom.fill

    def fill(self: SecureRandom, out: np.ndarray) -> np.ndarray:
        drawn.append(out.nbytes)
        return real_fill(self, out)

    monkeypatch.setattr(SecureRandom, "fill", fill)
    data = _parsed()
    two_scales = "sigma_y" in registry.accountant(mechanism, accountant or "tight").key_names
    noise = noise_for(
        mechanism,
        params,
        facts_of(data),
        sigma=0.5,
        sigma_y=0.5 if two_scales else None,
        accountant=accountant,
    )
    generator, sampler = randomness(noise_sampler)
    streams = _Streams(monkeypatch)
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
    assert streams.untouched(), "a release moved a global generator's state"
    monkeypatch.undo()
    assert rows == out.rows > 0
    assert sum(drawn) > 0
    assert bool(streams.torch_generator.made) == (mechanism == "dpgm")
    unseeded = torch.Generator().initial_seed()
    assert all(g.initial_seed() != unseeded for g in streams.torch_generator.made)
    assert bool(streams.public_numpy) == (mechanism in ("mst", "aim"))


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
