"""Releases on the Dask engine through the service (issue 16, item 4; docs/scaling.md, "Running
releases on Dask"): ``DPRELEASE_RELEASE_ENGINE=dask`` with a LocalCluster of thread workers
(``DPRELEASE_DASK_LOCAL_PROCESSES=false``) and small row groups, so the dataset is several
Parquet partitions.

- (embedded and real mode: through the Celery worker) a DPMix record-assignment release and
  a DP-CDA release run on Dask (the single-machine
  generator is never started, the Dask job runs once), say ``engine: dask`` and are charged
  once, their ε;
- an option the distributed engine lacks runs locally and says ``engine: local``;
- the Dask release and the local release of the same data and params agree in distribution:
  every per-coordinate check below is a z-test at |z| ≤ 6 against the exact expectation (or
  the other engine's release) with a variance derived from the declared noise and the data,
  false-failure rate 2·Φ(−6) ≈ 2·10⁻⁹ per check under the normal approximation (the noise is
  Gaussian and dominates the bounded mixing part); 78 checks in all: ≤ 2·10⁻⁷.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.preprocessing import RowTransform
from tests.conftest import Harness, embedded_harness, npz_bytes, toy_dataset

N, D, K = 1200, 4, 3
RANGE = (0.0, 18.0)
Z = 6.0  # two-sided false-failure rate 2·Φ(−6) ≈ 1.97e-9 per check
# C = √d: no record scaled to [0, 1]^d is longer, so nothing is clipped and the expectations
# below are the plain means of the records scaled to [0, 1].
C = 2.0
DPMIX: dict[str, Any] = {
    "mixture_degree": 8,
    "n_samples": 3000,
    "assignment": "record",
    "clip_norm": C,
}
DPCDA: dict[str, Any] = {
    "mixture_degree": 8,
    "n_samples": 3000,
    "min_class_size": 100,
    "standardization": "unit_range",
    "clip_norm": C,
    "class_sizes": "declared",  # the Dask job implements declared class sizes only
}


@pytest.fixture
def dask_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The embedded harness with the Dask engine: 2 thread workers, 250-row partitions."""
    with embedded_harness(
        tmp_path / "dask-home", monkeypatch, **DASK_SETTINGS, scratch_dir=tmp_path / "scratch"
    ) as harness:
        yield harness


DASK_SETTINGS = {
    "release_engine": "dask",
    "dask_local_processes": False,
    "dask_local_workers": 2,
    "dask_row_group_rows": 250,
}


@pytest.fixture
def dask_harness(
    harness: Harness,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Harness:
    """``harness`` (embedded, and real: its in-process Celery worker) with the Dask engine set
    on the runtime that runs its jobs."""
    if harness.mode == "embedded":
        settings = harness.runtime.settings
    else:
        settings = request.getfixturevalue("real_services")["worker_runtime"].settings
    for name, value in {**DASK_SETTINGS, "scratch_dir": tmp_path / "scratch"}.items():
        monkeypatch.setattr(settings, name, value)
    return harness


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the Dask jobs run and the single-machine generators started."""
    from dpcore.mechanisms.dpcda import release as dpcda_release
    from dpcore.mechanisms.dpmix import release as dpmix_release
    from worker import dask_release

    counts = {"dask_jobs": 0, "local_started": 0}

    def counting(original: Any, key: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(*args, **kwargs)

        return wrapped

    def started(original: Any) -> Any:
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            counts["local_started"] += 1  # runs at the first next(), not at the call
            yield from original(*args, **kwargs)

        return generator

    monkeypatch.setattr(dask_release, "run_job", counting(dask_release.run_job, "dask_jobs"))
    monkeypatch.setattr(
        dpmix_release, "generate_by_record", started(dpmix_release.generate_by_record)
    )
    monkeypatch.setattr(dpmix_release, "generate", started(dpmix_release.generate))
    monkeypatch.setattr(dpcda_release, "generate", started(dpcda_release.generate))
    return counts


def _dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(16)
    y = rng.integers(0, K, size=N)
    X = rng.uniform(0, 10, size=(N, D)) + 4.0 * y[:, None]  # class means 4/18 apart
    return X, y


def _upload(h: Harness, owner: str) -> dict[str, Any]:
    X, y = _dataset()
    r = h.upload(
        owner,
        npz_bytes(X, y),
        feature_range=list(RANGE),
        budget={"epsilon": 100.0, "delta": 1e-4},
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def _release(
    h: Harness, owner: str, dataset_id: str, mechanism: str, params: dict[str, Any], eps: float
) -> tuple[dict[str, Any], Any]:
    body = h.release_body(dataset_id, mechanism=mechanism, params=params, epsilon=eps)
    r = h.client.post("/releases", json={**body, "noise_sampler": "fast"}, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"], timeout=300)
    assert done["status"] == "succeeded", done
    # The laws are the drawn rows': the owner's copy where the release clipped them.
    drawn = h.as_drawn(owner, done["id"])
    npz = np.load(io.BytesIO(drawn if drawn is not None else h.download(owner, done["id"])))
    return done, npz


def _meta(npz: Any) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(str(npz["metadata"]))
    return meta


def test_dask_releases_run_on_dask_and_are_charged_once(
    dask_harness: Harness, spies: dict[str, int], tmp_path: Path
) -> None:
    h = dask_harness
    owner, _ = h.new_key("owner")
    ds = _upload(h, owner)
    released = []
    for mechanism, params, eps in (("dpmix", DPMIX, 2.0), ("dpcda", DPCDA, 3.0)):
        jobs = spies["dask_jobs"]
        done, npz = _release(h, owner, ds["id"], mechanism, params, eps)
        meta = _meta(npz)
        assert meta["engine"] == "dask" and meta["mechanism"] == mechanism
        provenance = json.loads(h.runtime.store.get(f"releases/{done['id']}/metadata.json"))
        assert provenance["engine"] == "dask"
        # The rows are the Dask job's (run once), never the single machine's.
        assert spies["dask_jobs"] == jobs + 1 and spies["local_started"] == 0
        rows = params["n_samples"] if mechanism == "dpmix" else K * -(-params["n_samples"] // K)
        assert npz["X"].shape == (rows, D)
        assert np.all(np.isfinite(npz["X"]))
        released.append((done, meta))

        ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
        mine = [e for e in ledger["entries"] if e["release_id"] == done["id"]]
        assert len(mine) == 1 and mine[0]["state"] == "committed"
        assert mine[0]["epsilon"] == pytest.approx(meta["charge"]["epsilon"], rel=1e-12)
        assert mine[0]["epsilon"] == pytest.approx(eps, rel=1e-6)
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert [e["release_id"] for e in ledger["entries"]] == [d["id"] for d, _ in released]
    assert ledger["spent"] == pytest.approx(sum(m["charge"]["epsilon"] for _, m in released))
    # Nothing of the jobs' scratch (the Parquet partitions) is left behind.
    assert (tmp_path / "scratch").is_dir()  # the jobs' scratch root, theirs
    assert not any((tmp_path / "scratch").rglob("*.parquet"))


def test_options_the_engine_lacks_run_locally(
    dask_embedded: Harness, spies: dict[str, int]
) -> None:
    h = dask_embedded
    owner, _ = h.new_key("owner")
    X, y = toy_dataset()  # n = 200: the mixture assignment's accounting stays cheap
    toy = h.upload(owner, npz_bytes(X, y)).json()
    ds = _upload(h, owner)
    cases = (
        (toy["id"], "dpmix", {"mixture_degree": 8, "n_samples": 300}, 1.0),  # mixture assignment
        # DP statistics are drawn by the single-machine build: the job builder refuses them.
        (
            ds["id"],
            "dpcda",
            {
                "mixture_degree": 4,
                "n_samples": 1500,
                "min_class_size": 100,
                "standardization": "dp",
                "stats_noise": 2.0,
            },
            50.0,
        ),
    )
    for dataset_id, mechanism, params, eps in cases:
        started = spies["local_started"]
        _, npz = _release(h, owner, dataset_id, mechanism, params, eps)
        assert _meta(npz)["engine"] == "local"
        assert spies["local_started"] == started + 1
    assert spies["dask_jobs"] == 0


# --- distribution: the Dask release against the exact expectations and the local release ---


def _unit(X: np.ndarray) -> np.ndarray:
    """The records as both engines read them before the divisor (no clipping at C = √d)."""
    lo, hi = np.full(D, RANGE[0]), np.full(D, RANGE[1])
    v = RowTransform.unit_range(lo, hi, C, divide=False).rows(X)
    assert np.all(np.linalg.norm(v, axis=1) <= C)
    return np.asarray(v, dtype=np.float64)


def _sigma(meta: dict[str, Any], name: str) -> float:
    return float(next(s["sigma"] for s in meta["noise"]["scales"] if s["name"] == name))


def _check(observed: np.ndarray, expected: np.ndarray, sd: np.ndarray, what: str) -> None:
    z = (observed - expected) / sd
    assert np.all(np.abs(z) <= Z), f"{what}: z = {np.round(z, 2)}"


def _dpmix_laws(npz: Any) -> None:
    """Record assignment: every record joins exactly k = Tℓ/n mixtures, so the mean of the
    T noiseless rows is exactly the records' mean (Tℓ/n = 20 here); only the noise moves it:
    N(0, σ²/T) per coordinate in the mechanism's scale (features: v/C; labels: one-hot)."""
    X, y = _dataset()
    meta = _meta(npz)
    T, ell = DPMIX["n_samples"], DPMIX["mixture_degree"]
    assert T * ell % N == 0
    sx, sy = _sigma(meta, "features"), _sigma(meta, "labels")
    # Back to the mechanism's scale: value = released / (scale · divisor) (shift 0 here).
    values = np.asarray(npz["X"], dtype=np.float64) / (RANGE[1] * C)
    expected = _unit(X).mean(axis=0) / C
    _check(values.mean(axis=0), expected, np.full(D, sx / math.sqrt(T)), "dpmix feature means")
    onehot = np.eye(K)[y]
    labels = np.asarray(npz["y"], dtype=np.float64)
    _check(labels.mean(axis=0), onehot.mean(axis=0), np.full(K, sy / math.sqrt(T)), "labels")
    # Power: a row in the wrong scale (e.g. not divided by C: twice the mean) or a biased
    # subset of the records would be far outside the tolerance (< 20% of every mean).
    assert Z * sx / math.sqrt(T) < 0.2 * expected.min()


def others(c: int) -> list[int]:
    return [o for o in range(K) if o != c]


def _dpcda_laws(npz: Any) -> None:
    """Per class c, each row is the mean of ℓ distinct uniform members plus N(0, σ²): i.i.d.
    rows of mean m_c and variance V = σ² + s²_c·(n_c − ℓ)/(ℓ(n_c − 1)) per coordinate (s²_c
    the class's population variance). Means: sd √(V/T_c). Sample variances: sd
    √((μ₄ − V²)/T_c) with μ₄ − V² ≤ 2σ⁴ + 4σ²m + m for the mixing part's variance m (its
    deviations are at most 1 in [0, 1] units: μ₄ ≤ m)."""
    X, y = _dataset()
    meta = _meta(npz)
    sigma = _sigma(meta, "features")
    ell = DPCDA["mixture_degree"]
    v = _unit(X)
    values = np.asarray(npz["X"], dtype=np.float64) / RANGE[1]  # scale 18, divisor 1
    labels = np.asarray(npz["y"])
    drawn = labels.argmax(axis=1) if labels.ndim == 2 else labels.astype(np.int64)
    if labels.ndim == 2:  # exact one-hot labels
        np.testing.assert_array_equal(labels, np.eye(K)[drawn])
    per_class = -(-DPCDA["n_samples"] // K)
    assert np.array_equal(np.bincount(drawn, minlength=K), np.full(K, per_class))
    for c in range(K):
        members = v[y == c]
        n_c = members.shape[0]
        m = members.var(axis=0) * (n_c - ell) / (ell * (n_c - 1))
        V = sigma**2 + m
        rows = values[drawn == c]
        T_c = rows.shape[0]
        _check(rows.mean(axis=0), members.mean(axis=0), np.sqrt(V / T_c), f"class {c} means")
        spread = np.sqrt((2 * sigma**4 + 4 * sigma**2 * m + m) / T_c)
        _check(rows.var(axis=0, ddof=1), V, spread, f"class {c} variances")
        # Power: rows mixed from another class's records (a routing bug) would be outside.
        gap = min(np.abs(v[y == o].mean(axis=0) - members.mean(axis=0)).min() for o in others(c))
        assert Z * np.sqrt(V / T_c).max() < 0.5 * gap


def _two_sample(a: Any, b: Any, mechanism: str) -> None:
    """The two engines' releases against each other: per-coordinate means of independent
    releases, each of the variance its law above gives (so sd √2 times one release's)."""
    sigma = _sigma(_meta(a), "features")
    assert sigma == _sigma(_meta(b), "features")
    xa, xb = np.asarray(a["X"], np.float64), np.asarray(b["X"], np.float64)
    if mechanism == "dpmix":
        sd = np.full(D, math.sqrt(2) * sigma / math.sqrt(DPMIX["n_samples"]) * RANGE[1] * C)
        _check(xa.mean(axis=0), xb.mean(axis=0), sd, "dpmix dask vs local")
        return
    X, y = _dataset()
    v = _unit(X)
    ell = DPCDA["mixture_degree"]
    ya, yb = np.asarray(a["y"]), np.asarray(b["y"])
    da = ya.argmax(axis=1) if ya.ndim == 2 else ya
    db = yb.argmax(axis=1) if yb.ndim == 2 else yb
    for c in range(K):
        members = v[y == c]
        n_c = members.shape[0]
        V = sigma**2 + members.var(axis=0) * (n_c - ell) / (ell * (n_c - 1))
        ra, rb = xa[da == c], xb[db == c]
        sd = np.sqrt(V / ra.shape[0] + V / rb.shape[0]) * RANGE[1]
        _check(ra.mean(axis=0), rb.mean(axis=0), sd, f"dpcda class {c} dask vs local")


def test_dask_and_local_releases_agree_in_distribution(
    dask_embedded: Harness, embedded: Harness
) -> None:
    out: dict[str, dict[str, Any]] = {}
    for engine, h in (("dask", dask_embedded), ("local", embedded)):
        owner, _ = h.new_key("owner")
        ds = _upload(h, owner)
        for mechanism, params in (("dpmix", DPMIX), ("dpcda", DPCDA)):
            _, npz = _release(h, owner, ds["id"], mechanism, params, 20.0)
            assert _meta(npz)["engine"] == engine
            out.setdefault(mechanism, {})[engine] = npz
    for engine in ("dask", "local"):
        _dpmix_laws(out["dpmix"][engine])
        _dpcda_laws(out["dpcda"][engine])
    for mechanism in ("dpmix", "dpcda"):
        _two_sample(out[mechanism]["dask"], out[mechanism]["local"], mechanism)


# --- partitions staged in the object store, as a remote cluster reads them -------------------


@pytest.fixture
def store_staging(
    real: Harness, real_services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Harness:
    """The real harness whose Celery worker runs Dask releases on a thread LocalCluster with
    the partitions staged in the tests' S3 server (``DPRELEASE_DASK_STAGING=store``) and no
    ``DPRELEASE_SCRATCH_DIR``. The settlement's sweep of a release's staging prefix
    (``staging.discard``) is off: what is shown is that the job removes its own."""
    from worker import staging

    settings = real_services["worker_runtime"].settings
    for name, value in {**DASK_SETTINGS, "dask_staging": "store", "scratch_dir": None}.items():
        monkeypatch.setattr(settings, name, value)
    monkeypatch.setattr(staging, "discard", lambda store, release_id: None)
    return real


def _staged(h: Harness, release_id: str) -> dict[str, int]:
    """The objects under the release's staging prefix: key → size."""
    store = h.runtime.store
    listed = store.client.list_objects_v2(  # type: ignore[attr-defined]
        Bucket=store.bucket,  # type: ignore[attr-defined]
        Prefix=f"releases/{release_id}/staging/",
    )
    return {o["Key"]: int(o["Size"]) for o in listed.get("Contents", [])}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, real: Harness) -> list[tuple[str, Any, dict[str, int]]]:
    """Every partition a task opens: its URL, the S3 access it carries, and the release's
    staged objects at the first read (the release id from the URL)."""
    from worker import dask_release

    seen: list[tuple[str, Any, dict[str, int]]] = []
    original = dask_release._open

    def spying(url: str, access: Any = None) -> Any:
        release_id = url.split("/releases/")[-1].split("/")[0]
        seen.append((url, access, {} if seen else _staged(real, release_id)))
        return original(url, access)

    monkeypatch.setattr(dask_release, "_open", spying)
    return seen


def test_a_dask_release_stages_in_the_object_store(
    store_staging: Harness,
    real_services: dict[str, Any],
    reads: list[tuple[str, Any, dict[str, int]]],
    spies: dict[str, int],
) -> None:
    h, s3 = store_staging, real_services["s3"]
    refusals = len(s3.verifier.refusals)
    owner, _ = h.new_key("owner")
    ds = _upload(h, owner)
    done, npz = _release(h, owner, ds["id"], "dpmix", DPMIX, 20.0)
    assert _meta(npz)["engine"] == "dask" and spies["dask_jobs"] == 1
    assert spies["local_started"] == 0
    _dpmix_laws(npz)
    # Every partition was read by a task through the S3 protocol, with the store's endpoint
    # and credentials it carried: never a path on a shared filesystem.
    prefix = f"{h.runtime.store.bucket}/releases/{done['id']}/staging/"  # type: ignore[attr-defined]
    assert reads and all(url.startswith(prefix) for url, _, _ in reads)
    assert all(access is not None for _, access, _ in reads)
    assert {access.endpoint_url for _, access, _ in reads} == {s3.endpoint_url}
    assert len(s3.verifier.refusals) == refusals  # every request signed with them
    # While read: N / 250 → 5 partitions, one object each; sizes a function of the row count.
    staged = reads[0][2]
    assert sorted(k.rsplit("/", 1)[1] for k in staged) == [
        f"part-{i:05d}.parquet" for i in range(5)
    ]
    sizes = [staged[k] for k in sorted(staged)]
    assert len(set(sizes[:4])) == 1 and sizes[4] < sizes[0]  # 4 × 250 rows, then 200
    assert _staged(h, done["id"]) == {}  # removed by the job


@pytest.mark.parametrize("failing", ["task", "writer"])
def test_a_failed_dask_release_leaves_no_staged_objects(
    store_staging: Harness,
    reads: list[tuple[str, Any, dict[str, int]]],
    monkeypatch: pytest.MonkeyPatch,
    failing: str,
) -> None:
    """A map task raising (the job's rows raise), or the artifact writer failing after the
    first chunk (the rows are closed part-way, as on a cancel): the release fails and nothing
    it staged is left once it says so."""
    from dpcore import artifacts
    from worker import dask_release

    def task(part: Any, p: int, columns: Any, *rest: Any) -> Any:
        dask_release.load(part, columns)  # its partition read, then the task fails
        raise RuntimeError("the task failed")

    def writer(self: Any, *args: Any) -> None:
        raise RuntimeError("the writer failed")

    if failing == "task":
        monkeypatch.setattr(dask_release, "_record_map", task)
    else:
        monkeypatch.setattr(artifacts.ArtifactWriter, "write", writer)
    h = store_staging
    owner, _ = h.new_key("owner")
    ds = _upload(h, owner)
    body = h.release_body(ds["id"], mechanism="dpmix", params=DPMIX, epsilon=2.0)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"], timeout=300)
    assert done["status"] == "failed" and f"the {failing} failed" in done["error"]
    assert reads and len(reads[0][2]) == 5  # staged, and read
    assert _staged(h, done["id"]) == {}
