"""``worker/staging.py``: where a Dask release's partitions wait for the cluster's tasks, what
their objects reveal, and their removal however the job ends (docs/scaling.md, "The data").
A release through the Dask engine with the partitions in the tests' S3 server is
tests/integration/test_dask_releases.py::test_a_dask_release_stages_in_the_object_store."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from pydantic import SecretStr

from service.config import Settings
from service.releases import keys
from service.storage import LocalObjectStore, S3ObjectStore
from tests.conftest import free_port
from tests.sigv4_s3 import SigV4S3Server
from worker import dask_release, scratch, staging

N, D, K, ROWS = 330, 5, 3, 100
COLUMNS = dask_release.Columns(tuple(f"f{j}" for j in range(D)), "label", tuple(range(K)))
ACCESS, SECRET = "AKSTAGING", "secret-of-the-staging-tests"


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 10, size=(N, D)), rng.integers(0, K, size=N)


def _loaded(parts: list[dask_release.Part]) -> tuple[np.ndarray, np.ndarray]:
    loaded = [dask_release.load(p, COLUMNS) for p in parts]
    return np.concatenate([x for x, _ in loaded]), np.concatenate([y for _, y in loaded])


def _local(mode: str, scheduler: str | None = None) -> Any:
    """Settings of the embedded mode's local store (no S3)."""
    return SimpleNamespace(
        dask_staging=mode, dask_scheduler=scheduler, uses_s3=False, s3_bucket=None
    )


def _store_staging(store: Any, tmp_path: Path, release: str = "rel-1") -> staging.StoreStaging:
    staged = staging.staging_for(_local("store"), store, release, 1, tmp_path / "job" / "dask")
    assert isinstance(staged, staging.StoreStaging)
    return staged


def test_scratch_staging_holds_the_rows_and_clears(tmp_path: Path) -> None:
    X, y = _data()
    staged = staging.ScratchStaging(tmp_path / "dask")
    parts = staged.stage(X, y, COLUMNS, ROWS)
    assert [p.rows for p in parts] == [100, 100, 100, 30]
    assert all(p.access is None and Path(p.url).parent == tmp_path / "dask" for p in parts)
    loaded_x, loaded_y = _loaded(parts)
    np.testing.assert_array_equal(loaded_x, X)
    np.testing.assert_array_equal(loaded_y, y)
    staged.clear()
    assert not any((tmp_path / "dask").iterdir())


def test_store_staging_in_the_local_store_holds_the_rows_and_clears(tmp_path: Path) -> None:
    """The embedded mode's store: objects under the release's staging prefix, read as files;
    the driver's scratch keeps only the record naming them while they exist."""
    store = LocalObjectStore(tmp_path / "objects")
    X, y = _data()
    staged = _store_staging(store, tmp_path)
    assert staged.folder.startswith(keys.staging_prefix("rel-1") + "1-")
    parts = staged.stage(X, y, COLUMNS, ROWS)
    assert [p.rows for p in parts] == [100, 100, 100, 30]
    names = sorted(p.name for p in (tmp_path / "objects" / staged.folder).iterdir())
    assert names == [f"part-{i:05d}.parquet" for i in range(4)]
    loaded_x, loaded_y = _loaded(parts)
    np.testing.assert_array_equal(loaded_x, X)
    np.testing.assert_array_equal(loaded_y, y)
    # One partition at a time passed through the driver's scratch; only the record is left.
    assert [p.name for p in (tmp_path / "job" / "dask").iterdir()] == [staging.RECORD]
    staged.clear()
    assert not (tmp_path / "objects" / staged.folder).exists()
    assert not (tmp_path / "job" / "dask" / staging.RECORD).exists()
    staged.clear()  # idempotent


def test_staged_sizes_are_functions_of_the_shape_alone(tmp_path: Path) -> None:
    """Whoever lists the bucket sees the staged objects' names and sizes: those must say no
    more than the upload's public n and d. Constant, random and label-skewed data of one
    shape stage objects of identical sizes (no compression, dictionary or statistics); only
    the row count changes them."""
    X, y = _data()
    datasets = {
        "random": (X, y),
        "constant": (np.zeros((N, D)), np.zeros(N, dtype=np.int64)),
        "other": (np.round(X * 1e6) / 7.0, (y + 1) % K),
    }
    sizes = {}
    for name, (features, labels) in datasets.items():
        staged = staging.ScratchStaging(tmp_path / name)
        sizes[name] = [
            os.path.getsize(p.url) for p in staged.stage(features, labels, COLUMNS, ROWS)
        ]
    assert sizes["random"] == sizes["constant"] == sizes["other"]
    assert sizes["random"][0] == sizes["random"][1] != sizes["random"][3]  # 100 rows, 30 rows


def test_staging_follows_the_setting(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    cases = {
        ("auto", None): staging.ScratchStaging,  # the job's own LocalCluster
        ("auto", "tcp://scheduler:8786"): staging.StoreStaging,  # a remote cluster
        ("store", None): staging.StoreStaging,
        ("scratch", "tcp://scheduler:8786"): staging.ScratchStaging,  # a shared filesystem
    }
    for (mode, scheduler), kind in cases.items():
        chosen = staging.staging_for(_local(mode, scheduler), store, "r", 2, tmp_path / "s")
        assert type(chosen) is kind
    # One folder per job: two jobs of one release never share (nor delete) a folder.
    first, second = (_store_staging(store, tmp_path, "r") for _ in range(2))
    assert first.folder != second.folder
    assert first.folder.startswith("releases/r/staging/")


def test_the_tasks_get_the_stores_endpoint_and_credentials_never_in_a_repr() -> None:
    settings = Settings(  # type: ignore[call-arg]
        s3_endpoint_url="http://127.0.0.1:9",
        s3_bucket="bucket-x",
        s3_region="eu-west-3",
        s3_access_key_id=ACCESS,
        s3_secret_access_key=SecretStr(SECRET),
    )
    access = staging.access_of(settings)
    assert access == dask_release.S3Access("http://127.0.0.1:9", "eu-west-3", ACCESS, SECRET)
    part = dask_release.Part("bucket-x/k", 0, 3, access)
    assert SECRET not in repr(part) and SECRET not in str(part)
    assert staging.access_of(Settings()) is None  # type: ignore[call-arg]  # the local store


@pytest.fixture
def s3_server() -> Iterator[SigV4S3Server]:
    with SigV4S3Server(free_port(), access_key=ACCESS, secret_key=SECRET) as server:
        yield server


def _s3_settings(server: SigV4S3Server, secret: str = SECRET) -> Settings:
    return Settings(  # type: ignore[call-arg]
        s3_endpoint_url=server.endpoint_url,
        s3_bucket="staging-tests",
        s3_access_key_id=ACCESS,
        s3_secret_access_key=SecretStr(secret),
        dask_staging="store",
    )


def test_tasks_read_s3_staged_partitions_with_the_credentials_they_carry(
    s3_server: SigV4S3Server, tmp_path: Path
) -> None:
    """Through the S3 protocol with the partition's own ``S3Access`` (every request checked
    against the store's credentials by the tests' server): no shared filesystem, and the
    wrong secret is refused."""
    settings = _s3_settings(s3_server)
    store = S3ObjectStore(settings)
    store.ensure_bucket()
    X, y = _data()
    staged = staging.staging_for(settings, store, "rel-s3", 1, tmp_path / "dask")
    parts = staged.stage(X, y, COLUMNS, ROWS)
    assert all(p.access is not None for p in parts)
    assert all(p.url.startswith(f"staging-tests/{keys.staging_prefix('rel-s3')}") for p in parts)
    loaded_x, loaded_y = _loaded(parts)
    np.testing.assert_array_equal(loaded_x, X)
    np.testing.assert_array_equal(loaded_y, y)
    assert s3_server.verifier.refusals == []
    wrong = staging.access_of(_s3_settings(s3_server, "not-the-secret"))
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        dask_release.load(dask_release.Part(parts[0].url, 0, parts[0].rows, wrong), COLUMNS)
    staged.clear()
    listed = store.client.list_objects_v2(Bucket="staging-tests", Prefix="releases/")
    assert listed.get("KeyCount", 0) == 0


# --- removal: a dead job's staging at the next start, a settled release's leftovers ---------


def _dead_job_dir(root: Path, folder: str) -> Path:
    """A job directory as a killed job leaves it: unlocked, with its staging record."""
    job = root / f"{scratch.PREFIX}999999-dead"
    (job / "dask").mkdir(parents=True)
    (job / scratch.LOCK).touch()
    (job / "dask" / staging.RECORD).write_text(folder)
    return job


def test_a_dead_jobs_staged_objects_go_at_the_next_start(tmp_path: Path) -> None:
    root, store = tmp_path / "scratch", LocalObjectStore(tmp_path / "objects")
    X, y = _data()
    staged = _store_staging(store, tmp_path)
    staged.stage(X, y, COLUMNS, ROWS)
    store.put("datasets/d1/data.npz", b"upload")
    dead = _dead_job_dir(root, staged.folder)
    # A record naming anything but a staging folder is ignored (the upload stays).
    odd = _dead_job_dir(root / "other", "datasets/")
    with scratch.job_dir(root) as alive:  # a live job's record is left alone
        live_folder = f"{keys.staging_prefix('rel-2')}1-live/"
        store.put(keys.staging_part(live_folder, 0), b"live")
        (alive / staging.RECORD).write_text(live_folder)
        removed = scratch.clean_stale(root, before_remove=staging.remove_recorded(lambda: store))
        assert removed == [dead]
        assert not (tmp_path / "objects" / staged.folder).exists()
        assert store.exists(keys.staging_part(live_folder, 0))
    scratch.clean_stale(root / "other", before_remove=staging.remove_recorded(lambda: store))
    assert not odd.exists() and store.exists("datasets/d1/data.npz")


def test_a_dead_jobs_directory_is_kept_while_its_objects_cannot_be_deleted(
    tmp_path: Path,
) -> None:
    root = tmp_path / "scratch"
    dead = _dead_job_dir(root, f"{keys.staging_prefix('rel-1')}1-abc/")

    class Down:
        def delete_prefix(self, prefix: str) -> int:
            raise ConnectionError("store down")

    before = staging.remove_recorded(lambda: Down())  # type: ignore[arg-type, return-value]
    assert scratch.clean_stale(root, before_remove=before) == []
    assert (dead / "dask" / staging.RECORD).is_file()  # tried again at the next start
    fd = os.open(dead / scratch.LOCK, os.O_RDWR)  # and its lock is free again
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_settled_release_loses_every_staged_folder(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    for job in ("1-a", "2-b"):
        store.put(keys.staging_part(f"{keys.staging_prefix('rel-1')}{job}/", 0), b"x")
    store.put(keys.artifact("rel-1", "npz"), b"release")
    staging.discard(store, "rel-1")
    assert not (tmp_path / "objects" / keys.staging_prefix("rel-1")).exists()
    assert store.exists(keys.artifact("rel-1", "npz"))
