"""``worker/engines.py``: which engine draws a release's rows (issue 16, item 4). The service
path (a LocalCluster, the ledger, the laws) is tests/integration/test_dask_releases.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms.run import build, facts_of, noise_for, randomness
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import RowTransform
from service.datasets.parsing import ParsedDataset
from service.releases import keys
from service.storage import LocalObjectStore
from worker import dask_release, engines
from worker.staging import ScratchStaging, Staging, StoreStaging

N, D, K = 300, 4, 3
RECORD = {"mixture_degree": 4, "n_samples": 120, "assignment": "record", "clip_norm": 2.0}
# The Dask job implements declared class sizes (DP class sizes are drawn at build time).
CLASSES = {
    "mixture_degree": 4,
    "n_samples": 120,
    "min_class_size": 20,
    "clip_norm": 2.0,
    "class_sizes": "declared",
}
DP_STATS = {**CLASSES, "standardization": "dp", "stats_noise": 1.0}
DP_SIZES = {**CLASSES, "class_sizes": "dp"}  # the default, count_noise by its rule


def _parsed() -> ParsedDataset:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, K, size=N)
    X = np.round(rng.uniform(0, 10, size=(N, D)), 3)
    return ParsedDataset(
        X=X,
        feature_shape=(D,),
        feature_names=[f"x{j}" for j in range(D)],
        labels=labels,
        classes=["a", "b", "c"],
        classes_declared=True,
        lo=np.zeros(D),
        hi=np.full(D, 10.0),
        clipped_values=0,
    )


def _settings(engine: str = "dask") -> Any:
    return SimpleNamespace(
        release_engine=engine,
        dask_scheduler=None,
        dask_local_workers=1,
        dask_local_processes=False,
        dask_row_group_rows=100,
        shard_rows=0,  # sharding off
        max_shards=1,
    )


def _built(
    mechanism: str, params: dict[str, Any], sampler_name: str = "fast"
) -> tuple[Any, Any, SecureRandom, Any, Any]:
    parsed = _parsed()
    sigma_y = 1.0 if mechanism == "dpmix" else None
    noise = noise_for(mechanism, params, facts_of(parsed), sigma=1.0, sigma_y=sigma_y)
    generator, sampler = randomness(sampler_name)
    output = build(
        mechanism,
        params,
        parsed,
        noise=noise,
        sampler=sampler,
        generator=generator,
        device=torch.device("cpu"),
    )
    return parsed, noise, generator, sampler, output


def _choose(
    mechanism: str, params: dict[str, Any], tmp_path: Path, engine: str = "dask", **kw: Any
) -> tuple[Any, engines.Engine, Any]:
    parsed, noise, generator, sampler, output = _built(mechanism, params, kw.get("sampler", "fast"))
    if kw.get("drawn"):
        generator.bytes(1)
    settings = _settings(engine)
    choice = engines.choose(settings, mechanism, params, parsed, noise)
    assert choice.plan is None  # no split under these settings
    chosen = engines.engine_for(
        choice,
        settings,
        parsed,
        output,
        noise=noise,
        sampler=sampler,
        generator=generator,
        staging=kw.get("staging") or ScratchStaging(tmp_path / "dask"),
    )
    return output, chosen, sampler


@pytest.mark.parametrize(("mechanism", "params"), [("dpmix", RECORD), ("dpcda", CLASSES)])
def test_supported_releases_take_the_dask_rows_and_close_the_build(
    tmp_path: Path, mechanism: str, params: dict[str, Any]
) -> None:
    output, chosen, _ = _choose(mechanism, params, tmp_path)
    assert chosen.name == "dask"
    assert chosen.output.chunks is not output.chunks
    # Everything but the chunks is the build's (rows, transform, preprocessing, ...).
    assert chosen.output.rows == output.rows and chosen.output.transform is output.transform
    assert chosen.output.preprocessing == output.preprocessing
    # The build's generator was closed before it started: it can never draw.
    with pytest.raises(StopIteration):
        next(output.chunks)
    # Nothing is staged (nor any cluster started) before the first chunk is asked for
    # (tests/unit/test_dask_staging.py: what is staged, and its removal).
    assert not (tmp_path / "dask").exists()
    chosen.output.chunks.close()  # type: ignore[attr-defined]  # never started: no cluster


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("dpmix", {**RECORD, "assignment": "mixture"}),
        ("dpcda", DP_STATS),
        ("dpcda", DP_SIZES),
        ("dpcda", {**CLASSES, "postprocess": "denoise"}),
    ],
)
def test_options_the_job_lacks_stay_local(
    tmp_path: Path, mechanism: str, params: dict[str, Any]
) -> None:
    output, chosen, _ = _choose(mechanism, params, tmp_path)
    assert chosen.name == "local" and chosen.output is output
    assert not (tmp_path / "dask").exists()


def test_dp_statistics_are_drawn_by_the_build() -> None:
    """Why the Dask path refuses them: the single machine draws them at build time (the guard
    in ``engines`` would also refuse a build that drew anything)."""
    _, _, generator, _, _ = _built("dpcda", DP_STATS)
    assert generator.position > 0
    _, _, generator, _, _ = _built("dpcda", DP_SIZES)
    assert generator.position > 0
    _, _, generator, _, _ = _built("dpcda", CLASSES)
    assert generator.position == 0
    _, _, generator, _, _ = _built("dpmix", RECORD)
    assert generator.position == 0


def test_a_build_that_drew_stays_local(tmp_path: Path) -> None:
    output, chosen, _ = _choose("dpmix", RECORD, tmp_path, drawn=True)
    assert chosen.name == "local" and chosen.output is output


def test_the_local_engine_changes_nothing(tmp_path: Path) -> None:
    output, chosen, _ = _choose("dpmix", RECORD, tmp_path, engine="local")
    assert chosen.name == "local" and chosen.output is output


def test_position_counts_the_bytes_drawn() -> None:
    source = SecureRandom.from_seed(1)
    assert source.position == 0
    source.bytes(10)
    source.words(3)
    assert source.position == 10 + 3 * 8


def test_same_transform() -> None:
    lo, hi = np.zeros(3), np.ones(3)
    a = RowTransform.unit_range(lo, hi, 1.5)
    assert engines.same_transform(a, RowTransform.unit_range(lo, hi, 1.5))
    assert not engines.same_transform(a, RowTransform.unit_range(lo, hi, 1.5, divide=False))
    assert not engines.same_transform(a, RowTransform.unit_range(lo, 2 * hi, 1.5))
    assert not engines.same_transform(a, RowTransform.unit_range(lo, hi, 1.0))


@pytest.mark.parametrize(("mechanism", "params"), [("dpmix", RECORD), ("dpcda", CLASSES)])
def test_secure_lattices_in_the_metadata_are_the_workers(
    tmp_path: Path, mechanism: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's ``noise_lattices`` come from the release's (unused) secure sampler: the
    Dask path plans there exactly what the reducers plan on the workers (thread workers here,
    so every plan, the driver's and the workers', passes the recorder)."""
    from dpcore.mechanisms.noise import SecureNoise

    planned: set[tuple[float, float, int, float, float]] = set()
    original = SecureNoise.plan

    def recording(self: SecureNoise, **kw: Any) -> Any:
        unit = float(kw.get("unit") or 0.0)
        planned.add(
            (float(kw["sigma"]), float(kw["sensitivity"]), int(kw["dim"]), kw["error"], unit)
        )
        return original(self, **kw)

    monkeypatch.setattr(SecureNoise, "plan", recording)
    output, chosen, sampler = _choose(mechanism, params, tmp_path, sampler="secure")
    assert chosen.name == "dask" and isinstance(sampler, SecureNoise)
    driver = set(sampler.plans)
    assert driver and driver == planned  # before the job: the driver's plans only
    rows = sum(x.shape[0] for x, _ in chosen.output.chunks)
    assert rows == output.rows
    assert planned == driver  # the workers planned nothing else
    assert len(sampler.describe()) == (2 if mechanism == "dpmix" else 1)


def test_the_choice_precedes_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is chosen from the settings, the spec and the public parameters alone, and
    the mechanism's distributed job is built once: the job the choice holds is the one the
    Dask path runs."""
    parsed = _parsed()
    noise = noise_for("dpmix", RECORD, facts_of(parsed), sigma=1.0, sigma_y=1.0)
    calls: list[str] = []
    original = engines.distributed_job

    def counted(*args: Any) -> Any:
        calls.append("job")
        return original(*args)

    monkeypatch.setattr(engines, "distributed_job", counted)
    choice = engines.choose(_settings(), "dpmix", RECORD, parsed, noise)
    assert choice.job is not None and choice.plan is None and calls == ["job"]
    local = engines.choose(_settings("local"), "dpmix", RECORD, parsed, noise)
    assert local.job is None and local.plan is None and calls == ["job"]
    sharded = engines.choose(
        SimpleNamespace(**{**vars(_settings()), "shard_rows": 40, "max_shards": 8}),
        "dpmix",
        {**RECORD, "assignment": "mixture"},  # no Dask job for these: the split instead
        parsed,
        noise,
    )
    assert sharded.job is None and sharded.plan is not None and sharded.plan.count > 1


def test_the_dask_rows_clear_their_staging_however_they_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staged at the first chunk, removed when the rows stop: closed part-way (the writer
    closes them on a cancel or its own failure) or a task raising."""
    store = LocalObjectStore(tmp_path / "objects")
    staging_root = tmp_path / "objects" / keys.staging_prefix("r")

    def staged(job: int) -> Staging:
        folder = f"{keys.staging_prefix('r')}{job}-x/"
        return StoreStaging(store, folder, None, None, tmp_path / f"job-{job}")

    _, chosen, _ = _choose("dpmix", RECORD, tmp_path, staging=staged(1))
    chunks = chosen.output.chunks
    assert not staging_root.exists()
    next(chunks)
    assert len(list(staging_root.rglob("*.parquet"))) == 3
    chunks.close()  # type: ignore[attr-defined]
    assert not any(staging_root.rglob("*"))

    def broken(*args: object) -> object:
        raise RuntimeError("a task raised")

    monkeypatch.setattr(dask_release, "_record_map", broken)
    _, chosen, _ = _choose("dpmix", RECORD, tmp_path, staging=staged(2))
    with pytest.raises(RuntimeError, match="a task raised"):
        list(chosen.output.chunks)
    assert not any(staging_root.rglob("*"))
