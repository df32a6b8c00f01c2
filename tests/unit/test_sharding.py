"""Sharded releases (issue 16, item 3): the plan, the refusals, the sealed build, the part
format, and the law — a release drawn as shards with independent sources has the unsharded
release's distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.mechanisms import registry, sharding
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, materialise, noise_for, params_of
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset
from service.storage import LocalObjectStore
from tests.datasets import unit_dataset
from worker import shards

CPU = torch.device("cpu")


def _data(n: int = 300, d: int = 5, k: int = 3, seed: int = 0) -> ParsedDataset:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=n)
    X = rng.uniform(0, 1, size=(n, d))
    X[np.arange(n), labels % d] += 2.0  # class structure the statistics can see
    return unit_dataset(X / 3.0, labels, k)  # in [0, 1], as declared


# DP-CDA shards with declared class sizes only (DP class sizes are drawn once per release).
DECLARED = {"min_class_size": 20, "class_sizes": "declared"}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("dpmix", {"mixture_degree": 4, "n_samples": 3000}),
    ("dpcda", {"mixture_degree": 4, "n_samples": 3000, **DECLARED}),
    ("sgdrm", {"mixture_width": 4, "n_samples": 3000}),
]


def _noise(mechanism: str, params: dict[str, Any], data: ParsedDataset, sigma: float) -> Any:
    sigma_y = sigma if mechanism == "dpmix" else None
    return noise_for(mechanism, params, facts_of(data), sigma=sigma, sigma_y=sigma_y)


def _rows(
    mechanism: str, params: dict[str, Any], data: ParsedDataset, seed: int, sigma: float = 0.3
) -> tuple[np.ndarray, np.ndarray]:
    noise = _noise(mechanism, params, data, sigma)
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=FastNoise(SecureRandom.from_seed(seed)),
        generator=SecureRandom.from_seed(seed + 10_000),
        device=CPU,
    )
    X, Y, _, _ = materialise(out, raw_units=False)
    return X, Y


def _plan(mechanism: str, params: dict[str, Any], shard_rows: int) -> sharding.ShardPlan:
    spec = registry.get(mechanism)
    plan = sharding.plan(
        spec.execution.shard,
        params_of(spec, params),
        n_classes=3,
        shard_rows=shard_rows,
        max_shards=64,
    )
    assert plan is not None
    return plan


def _sharded(
    mechanism: str,
    params: dict[str, Any],
    data: ParsedDataset,
    seed: int,
    shard_rows: int = 700,
    shared_source: bool = False,
    sigma: float = 0.3,
) -> tuple[np.ndarray, np.ndarray]:
    """The shards' rows concatenated, each shard on its own seed (``shared_source``: the
    planted bug of every shard reusing one key). The noise is the release's own, declared for
    the whole release's parameters."""
    plan = _plan(mechanism, params, shard_rows)
    noise = _noise(mechanism, params, data, sigma)
    spec = registry.get(mechanism)
    parts = []
    for j in range(plan.count):
        s = seed if shared_source else seed + 7 * (j + 1)
        out = build(
            mechanism,
            plan.params_of(params_of(spec, params), j),
            data,
            noise=noise,
            sampler=FastNoise(SecureRandom.from_seed(s)),
            generator=SecureRandom.from_seed(s + 10_000),
            device=CPU,
        )
        parts.append(materialise(out, raw_units=False)[:2])
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# --- the plan ------------------------------------------------------------------------------


def test_plan_splits_units_evenly_and_its_key_names_it() -> None:
    plan = _plan("dpmix", {"mixture_degree": 4, "n_samples": 1003}, 250)
    assert plan.count == 5 and plan.units == (201, 201, 201, 200, 200) and plan.rows == 1003
    assert sharding.from_key("n_samples", plan.key) == plan
    with pytest.raises(ValueError, match="not a shard plan key"):
        sharding.from_key("n_samples", "5x1-0")
    with pytest.raises(ValueError, match="not a shard plan key"):
        sharding.from_key("n_samples", "../../x")


def test_dpcda_shards_whole_classes_and_makes_the_unsharded_row_count() -> None:
    # ⌈1000/3⌉ = 334 rows per class, 1002 rows: every shard asks for a multiple of 3.
    plan = _plan("dpcda", {"mixture_degree": 4, "n_samples": 1000, **DECLARED}, 300)
    assert plan.unit == 3 and plan.rows == 1002 and plan.count == 4
    spec = registry.get("dpcda")
    params = params_of(spec, {"mixture_degree": 4, "n_samples": 1000, **DECLARED})
    asked = [plan.params_of(params, j)["n_samples"] for j in range(plan.count)]
    assert all(a % 3 == 0 for a in asked) and sum(asked) == 1002


@pytest.mark.parametrize(
    ("mechanism", "params", "why"),
    [
        ("dpmix", {"mixture_degree": 4, "n_samples": 5000, "assignment": "record"}, "record"),
        (
            "dpcda",
            {
                "mixture_degree": 4,
                "n_samples": 5000,
                "min_class_size": 20,
                "standardization": "dp",
                "stats_noise": 2.0,
            },
            "statistics",
        ),
        (
            "dpcda",
            {
                "mixture_degree": 4,
                "n_samples": 5000,
                "min_class_size": 20,
                "class_sizes": "dp",
                "count_noise": 5.0,
            },
            "class sizes",
        ),
    ],
)
def test_configurations_that_draw_before_their_rows_are_never_sharded(
    mechanism: str, params: dict[str, Any], why: str
) -> None:
    spec = registry.get(mechanism)
    validated = params_of(spec, params)
    assert spec.execution.shard is not None and why in (
        spec.execution.shard.refuse(validated) or ""
    )
    assert (
        sharding.plan(spec.execution.shard, validated, n_classes=3, shard_rows=100, max_shards=64)
        is None
    )


def test_sharding_is_off_or_unneeded() -> None:
    spec = registry.get("dpmix")
    params = params_of(spec, {"mixture_degree": 4, "n_samples": 1000})
    assert (
        sharding.plan(spec.execution.shard, params, n_classes=3, shard_rows=0, max_shards=8) is None
    )
    assert (
        sharding.plan(spec.execution.shard, params, n_classes=3, shard_rows=1000, max_shards=8)
        is None
    )
    capped = sharding.plan(spec.execution.shard, params, n_classes=3, shard_rows=10, max_shards=8)
    assert capped is not None and capped.count == 8
    # Mechanisms whose rows are not independent draws declare no split.
    assert registry.get("local_perturbation").execution.shard is None
    assert registry.get("clustmix").execution.shard is None
    assert registry.get("dpgm").execution.shard is None


# --- the sealed build ----------------------------------------------------------------------


@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_shardable_builds_draw_nothing_before_their_rows(
    mechanism: str, params: dict[str, Any]
) -> None:
    """The finaliser builds the release's description with randomness that refuses every
    draw; the rows alone draw."""
    data = _data()
    generator, sampler = sharding.sealed()
    out = build(
        mechanism,
        params,
        data,
        noise=_noise(mechanism, params, data, 0.3),
        sampler=sampler,
        generator=generator,
        device=CPU,
    )
    assert out.rows == _plan(mechanism, params, 700).rows
    with pytest.raises(sharding.DrawRefused):
        next(iter(out.chunks))


def test_a_build_that_draws_first_is_caught_by_the_seal() -> None:
    """DP statistics are drawn at build time: the seal refuses it (why the spec refuses to
    shard that configuration)."""
    params = {
        "mixture_degree": 4,
        "n_samples": 3000,
        "min_class_size": 20,
        "standardization": "dp",
        "stats_noise": 2.0,
    }
    data = _data()
    noise = noise_for("dpcda", params, facts_of(data), sigma=0.3)
    generator, sampler = sharding.sealed()
    with pytest.raises(sharding.DrawRefused):
        build("dpcda", params, data, noise=noise, sampler=sampler, generator=generator, device=CPU)


# --- the law -------------------------------------------------------------------------------


def _statistics(X: np.ndarray, Y: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row summaries whose laws differ if subsets, noise or class shares do."""
    return {
        "feature 0": X[:, 0],
        "feature 1": X[:, 1],
        "row mean": X.mean(axis=1),
        "row norm": np.linalg.norm(X, axis=1),
        "label 0": Y[:, 0],
        "label argmax": Y.argmax(axis=1).astype(float),
    }


def _worst_p(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return min(stats.ks_2samp(a[k], b[k]).pvalue for k in a)


@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_sharded_rows_have_the_unsharded_law(mechanism: str, params: dict[str, Any]) -> None:
    """Two-sample KS tests on six per-row statistics, 3000 rows each (5 shards against one
    draw; fixed seeds, so the outcome is reproducible). Order is not compared: a release's
    rows are exchangeable within a class, and DP-CDA's come class by class per shard."""
    data = _data()
    whole = _statistics(*_rows(mechanism, params, data, seed=1))
    sharded_X, sharded_Y = _sharded(mechanism, params, data, seed=2)
    assert sharded_X.shape[0] == _plan(mechanism, params, 700).rows
    assert _worst_p(_statistics(sharded_X, sharded_Y), whole) > 1e-3


@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_the_law_test_catches_wrong_noise_in_the_shards(
    mechanism: str, params: dict[str, Any]
) -> None:
    """The same test fails when the shards drew with a different noise (σ 0.3 → 0.6)."""
    data = _data()
    whole = _statistics(*_rows(mechanism, params, data, seed=1))
    wrong = _statistics(*_sharded(mechanism, params, data, seed=2, sigma=0.6))
    assert _worst_p(wrong, whole) < 1e-6


@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_shards_sharing_a_source_repeat_rows(mechanism: str, params: dict[str, Any]) -> None:
    """Independence: shards on independent sources share no row; a shared source (the
    planted bug) repeats every equal-sized shard's rows exactly."""
    data = _data()
    X, _ = _sharded(mechanism, params, data, seed=3)
    assert len(np.unique(X, axis=0)) == len(X)
    X_bad, _ = _sharded(mechanism, params, data, seed=3, shared_source=True)
    assert len(np.unique(X_bad, axis=0)) < len(X_bad)


# --- the part format -----------------------------------------------------------------------


def test_parts_round_trip_through_the_store(tmp_path: Path) -> None:
    """The worker's draw writes a part the finaliser reads back exactly, in shard order;
    a part from another plan, or missing, is refused."""
    data = _data()
    params = {"mixture_degree": 4, "n_samples": 1000}
    plan = _plan("dpmix", params, 400)
    noise = _noise("dpmix", params, data, 0.3)
    store = LocalObjectStore(tmp_path / "store")
    drawn = []
    for j in range(plan.count):
        part = shards.draw(
            "dpmix",
            params,
            plan,
            j,
            data,
            noise=noise,
            noise_sampler="secure",
            device=CPU,
            path=tmp_path / f"p{j}.npz",
            report=lambda done, total, phase: None,
        )
        assert part.rows == plan.rows_of(j) and part.lattices  # the secure sampler's lattices
        assert shards.store_part(store, "r1", plan, j, part.path)
        assert not shards.store_part(store, "r1", plan, j, part.path)  # create-only
        with np.load(part.path) as z:
            drawn.append(z["rows"])
    assert shards.missing(store, "r1", plan) == []
    reader = shards.Parts(store, "r1", plan, n_features=5, scratch=tmp_path)
    chunks = [(x.numpy(), y.numpy()) for x, y in reader.chunks()]
    X = np.concatenate([c[0] for c in chunks])
    Y = np.concatenate([c[1] for c in chunks])
    expected = np.concatenate(drawn)
    assert np.array_equal(np.hstack([X, Y]), expected) and X.shape == (1000, 5)
    assert reader.lattices == part.lattices
    assert shards.count_try(store, "r1", plan, 0, limit=2) == 1
    assert shards.count_try(store, "r1", plan, 0, limit=2) == 2
    assert shards.count_try(store, "r1", plan, 0, limit=2) == 3  # over the limit
    shards.discard(store, "r1")
    assert shards.missing(store, "r1", plan) == list(range(plan.count))
    with pytest.raises(FileNotFoundError):
        list(shards.Parts(store, "r1", plan, n_features=5, scratch=tmp_path).chunks())


def test_the_catalogue_says_which_mechanisms_shard() -> None:
    from service.releases.mechanisms import catalogue

    said = {m.name: m.shardable for m in catalogue().items}
    assert said["dpmix"] == "by n_samples, except with assignment 'record'"
    assert said["sgdrm"] == "by n_samples" and said["clustmix"] is None
    assert "standardization 'dp'" in (said["dpcda"] or "")


def test_a_spec_must_shard_by_one_of_its_parameters() -> None:
    from dataclasses import replace

    from dpcore.mechanisms.spec import SpecError

    spec = registry.get("sgdrm")
    with pytest.raises(SpecError, match="shard counts rows by unknown"):
        replace(
            spec, execution=replace(spec.execution, shard=sharding.ShardSpec("rows"))
        ).validate()
