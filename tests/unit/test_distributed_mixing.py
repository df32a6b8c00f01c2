"""The map–reduce jobs of ``dpcore.distributed`` on a Dask ``LocalCluster``
(``worker/dask_release.py``) against the single-machine generators (issue 16, item 4).

(a) plumbing: with the noise off (an identity sampler, tests only) the distributed sums are
    exactly those of an independent oracle (record assignment: the same per-partition draws
    summed by ``np.add.at``; DP-CDA: the single-machine generator on the same rank stream);
(b) law: with the declared noise, statistics of the distributed release and of the
    single-machine one agree (two-sample KS, chi-square), and planted bugs (noise doubled
    or missing, k off by one, a biased assignment, one stream reused by every partition)
    fail the same checks;
(c) the noise added is the declared noise: the reducers' sampler is ``DeclaredNoise`` over
    the accountant's own description (an undeclared σ fails on the worker) and their
    sensitivities and rounding bounds are exactly those the single-machine generators pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.distributed import classes, record
from dpcore.distributed.tasks import NoiseSpec, SeededKeys
from dpcore.mechanisms.dpcda.generate import generate as cda_generate
from dpcore.mechanisms.dpmix.generate import generate_by_record
from dpcore.mechanisms.noise import FastNoise, UndeclaredNoise
from dpcore.mechanisms.run import noise_for
from dpcore.mechanisms.sampling import uniform_subsets
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import PublicFacts
from dpcore.preprocessing import RowTransform, one_hot

dask_release = pytest.importorskip("worker.dask_release")
pytest.importorskip("distributed")

# Clip norm of the unit-range transform: rows of [0, 1]⁴ have norm ≤ 2 < C, so the
# preprocessed rows are X / 4 exactly (dyadic: sums below are exact in float64).
C = 4.0


class Identity:
    """Tests only: no noise, to see the sums (the σ = 0 path exists nowhere else)."""

    def build(self, source: SecureRandom) -> Any:
        return lambda values, **_: values


class Scaled:
    """A planted bug: float noise at ``factor`` times the requested σ, not declared."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def build(self, source: SecureRandom) -> Any:
        fast = FastNoise(source)

        def add(values: torch.Tensor, *, sigma: float, **kw: Any) -> torch.Tensor:
            if self.factor == 0:
                return values
            return fast(values, sigma=sigma * self.factor, **kw)

        return add


class Recorder:
    """A single-machine sampler that records what it was asked (and adds nothing)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, float]] = []

    name = "recorder"

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        self.calls.append((sigma, sensitivity, error))
        return values


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    c = dask_release.client_for(None, workers=2, processes=False)
    yield c
    c.close()


def _dataset(n: int, d: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Values on the grid {0, ¼, ½, ¾, 1}; feature 0 marks the first half of the records."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 5, size=(n, d)) / 4.0
    X[:, 0] = (np.arange(n) < n // 2).astype(float)
    labels = rng.integers(0, n_classes, size=n)
    return X, labels


def _stored(
    tmp_path: Any, X: np.ndarray, labels: np.ndarray, rows: int, n_classes: int
) -> tuple[list[Any], Any, RowTransform]:
    names = [f"f{j}" for j in range(X.shape[1])]
    path = str(tmp_path / f"data-{X.shape[0]}-{rows}.parquet")
    dask_release.write_partitions(path, X, [f"c{v}" for v in labels], names, "label", rows)
    parts = dask_release.discover([path])
    assert len(parts) == -(-X.shape[0] // rows) >= 3
    columns = dask_release.Columns(tuple(names), "label", tuple(f"c{k}" for k in range(n_classes)))
    d = X.shape[1]
    return parts, columns, RowTransform.unit_range(np.zeros(d), np.ones(d), C)


def _record(
    client: Any,
    parts: Any,
    columns: Any,
    transform: Any,
    *,
    ell: int,
    T: int,
    noise: Any,
    seed: int,
    sigma: tuple[float, float] = (1.0, 1.0),
    bucket_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    chunks = list(
        dask_release.record_release(
            client,
            parts,
            columns,
            transform,
            mixture_degree=ell,
            n_samples=T,
            sigma_x=sigma[0],
            sigma_y=sigma[1],
            noise=noise,
            keys=SeededKeys(seed),
            bucket_rows=bucket_rows,
        )
    )
    return np.concatenate([c[0].numpy() for c in chunks]), np.concatenate(
        [c[1].numpy() for c in chunks]
    )


def _single_record(
    X: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    *,
    ell: int,
    T: int,
    noise: Any,
    seed: int,
    sigma: tuple[float, float] = (1.0, 1.0),
) -> tuple[np.ndarray, np.ndarray]:
    d = X.shape[1]
    features = torch.as_tensor(
        RowTransform.unit_range(np.zeros(d), np.ones(d), C).rows(X), dtype=torch.float32
    )
    onehot = torch.as_tensor(one_hot(labels, n_classes), dtype=torch.float32)
    gen = SecureRandom.from_seed(seed)
    chunks = list(
        generate_by_record(
            features,
            onehot,
            mixture_degree=ell,
            n_samples=T,
            sigma_x=sigma[0],
            sigma_y=sigma[1],
            generator=gen,
            noise=noise if noise is not None else FastNoise(gen),
        )
    )
    return np.concatenate([c[0].numpy() for c in chunks]), np.concatenate(
        [c[1].numpy() for c in chunks]
    )


# --- (a) exact plumbing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "ell", "T", "bucket_rows", "dense"),
    [(1000, 4, 60, 7, True), (750, 2, 1500, 128, False)],
)
def test_record_sums_are_exact(
    client: Any, tmp_path: Any, rows: int, ell: int, T: int, bucket_rows: int, dense: bool
) -> None:
    n, d, K = 3000, 4, 3
    X, labels = _dataset(n, d, K, seed=1)
    parts, columns, transform = _stored(tmp_path, X, labels, rows, K)
    x, y = _record(
        client,
        parts,
        columns,
        transform,
        ell=ell,
        T=T,
        noise=Identity(),
        seed=5,
        bucket_rows=bucket_rows,
    )
    plan = record.RecordPlan.make(
        n=n, mixture_degree=ell, n_samples=T, dim_x=d, dim_y=K, bucket_rows=bucket_rows
    )
    assert plan.buckets >= 3 and plan.dense(rows) is dense
    # The oracle: the same per-partition draws (each map task's own key), summed naively.
    data = np.concatenate([transform.rows(X), one_hot(labels, K)], axis=1)
    sums = np.zeros((T, d + K))
    for p, part in enumerate(parts):
        joined = record.assign(part.rows, plan, SeededKeys(5).source(f"record-map-{p}")).numpy()
        assert joined.shape == (part.rows, plan.k)
        assert all(len(set(r)) == plan.k for r in joined[:50])
        np.add.at(
            sums, joined.reshape(-1), np.repeat(data[p * rows : (p + 1) * rows], plan.k, axis=0)
        )
    np.testing.assert_array_equal(x, (sums[:, :d] / ell).astype(np.float32))
    np.testing.assert_array_equal(y, (sums[:, d:] / ell).astype(np.float32))
    assert y.sum() * ell == pytest.approx(n * plan.k)  # every record counted k times


def test_dpcda_picks_the_single_machine_records(client: Any, tmp_path: Any) -> None:
    """Same rank stream: the distributed job gathers the very records the single machine
    gathers (the routing is the stable sort's bijection), so the means are identical."""
    n, d, K, ell, T = 3000, 4, 3, 4, 600
    X, labels = _dataset(n, d, K, seed=2)
    parts, columns, _ = _stored(tmp_path, X, labels, 800, K)
    transform = RowTransform.unit_range(np.zeros(d), np.ones(d), 1.0, divide=False)
    got = list(
        dask_release.class_release(
            client,
            parts,
            columns,
            transform,
            mixture_degree=ell,
            n_samples=T,
            sigma=1.0,
            clip_norm=1.0,
            nonnegative=True,
            noise=Identity(),
            keys=SeededKeys(3),
            ranks=SecureRandom.from_seed(11),
        )
    )
    # Rows must be clipped to C = 1 here; dyadic data keeps the sums exact either way.
    features = torch.as_tensor(transform.rows(X), dtype=torch.float32)
    want = list(
        cda_generate(
            features,
            torch.as_tensor(labels),
            n_classes=K,
            mixture_degree=ell,
            n_samples=T,
            sigma=1.0,
            clip_norm=1.0,
            nonnegative=True,
            generator=SecureRandom.from_seed(11),
            noise=lambda v, **_: v,
        )
    )
    assert [g[0].shape for g in got] == [w[0].shape for w in want]
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        np.testing.assert_allclose(gx.numpy(), wx.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(gy.numpy(), wy.numpy())


# --- (b) the law -------------------------------------------------------------------------


def _record_statistics(x: np.ndarray, y: np.ndarray, ell: int) -> dict[str, np.ndarray]:
    """Per mixture: its size (ℓ·Σ labels, plus label noise) and its members from the first
    half of the dataset (ℓ·C·x₀, plus feature noise)."""
    return {"size": ell * y.sum(axis=1), "first_half": ell * C * x[:, 0]}


REC = {"n": 3000, "d": 4, "K": 2, "rows": 1000, "ell": 4, "T": 6000}
# Noise comparable to the size spread (sd ≈ 2): missing or doubled noise changes the law.
REC_SIGMA = (2 / (REC["ell"] * C), 2 / (REC["ell"] * math.sqrt(REC["K"])))


@pytest.fixture(scope="module")
def record_reference() -> dict[str, np.ndarray]:
    X, labels = _dataset(REC["n"], REC["d"], REC["K"], seed=3)
    x, y = _single_record(
        X, labels, REC["K"], ell=REC["ell"], T=REC["T"], noise=None, seed=21, sigma=REC_SIGMA
    )
    return _record_statistics(x, y, REC["ell"])


def _record_run(client: Any, tmp_path: Any, noise: Any, seed: int) -> dict[str, np.ndarray]:
    X, labels = _dataset(REC["n"], REC["d"], REC["K"], seed=3)
    parts, columns, transform = _stored(tmp_path, X, labels, REC["rows"], REC["K"])
    x, y = _record(
        client,
        parts,
        columns,
        transform,
        ell=REC["ell"],
        T=REC["T"],
        noise=noise,
        seed=seed,
        sigma=REC_SIGMA,
        bucket_rows=2048,
    )
    return _record_statistics(x, y, REC["ell"])


def _worst_p(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return min(stats.ks_2samp(a[k], b[k]).pvalue for k in a)


def _declared_record(sigma: tuple[float, float]) -> NoiseSpec:
    facts = PublicFacts(n=REC["n"], n_features=REC["d"], n_classes=REC["K"])
    params = {"mixture_degree": REC["ell"], "n_samples": REC["T"], "assignment": "record"}
    return NoiseSpec("fast", noise_for("dpmix", params, facts, sigma=sigma[0], sigma_y=sigma[1]))


def test_record_law_matches_single_machine(
    client: Any, tmp_path: Any, record_reference: dict[str, np.ndarray]
) -> None:
    got = _record_run(client, tmp_path, _declared_record(REC_SIGMA), seed=8)
    assert _worst_p(got, record_reference) > 1e-3


@pytest.mark.parametrize(
    "bug", ["noise doubled", "noise missing", "k off by one", "biased assignment"]
)
def test_record_law_catches_planted_bugs(
    client: Any,
    tmp_path: Any,
    record_reference: dict[str, np.ndarray],
    bug: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    noise: Any = _declared_record(REC_SIGMA)
    if bug == "noise doubled":
        noise = Scaled(2.0)
    elif bug == "noise missing":
        noise = Scaled(0.0)
    elif bug == "k off by one":
        k = record.RecordPlan.k.fget  # type: ignore[attr-defined]
        monkeypatch.setattr(record.RecordPlan, "k", property(lambda self: k(self) + 1))
    else:

        def biased(rows: int, plan: record.RecordPlan, source: SecureRandom) -> torch.Tensor:
            # k distinct ids, but from the lower half of range(T) only
            return uniform_subsets(
                plan.n_samples // 2, plan.k, rows, generator=source, device=torch.device("cpu")
            )

        monkeypatch.setattr(record, "assign", biased)
    got = _record_run(client, tmp_path, noise, seed=8)
    assert _worst_p(got, record_reference) < 1e-6


def _pair_counts(members: np.ndarray, n: int) -> np.ndarray:
    """members (T × n, 0/1): how many mixtures hold each pair i < j."""
    co = members.T @ members
    return co[np.triu_indices(n, 1)]


@pytest.mark.parametrize("bug", [None, "one stream for every partition"])
def test_record_pair_inclusion(client: Any, tmp_path: Any, bug: str | None) -> None:
    """Record identities as one-hot features, noise off: the mixtures show their members.
    The number of mixtures two records share has the single machine's law, for pairs in one
    partition and pairs across partitions alike."""
    n, rows, ell, T = 60, 20, 3, 60
    X = np.eye(n)
    labels = np.zeros(n, dtype=np.int64)
    names = [f"r{j}" for j in range(n)]
    path = str(tmp_path / "ids.parquet")
    dask_release.write_partitions(path, X, ["a"] * n, names, "label", rows)
    parts = dask_release.discover([path])
    columns = dask_release.Columns(tuple(names), "label", ("a",))
    transform = RowTransform.unit_range(np.zeros(n), np.ones(n), 1.0)
    keys: Any = SeededKeys(0)
    dist, single = [], []
    for seed in range(6):
        keys = SeededKeys(seed)
        if bug:

            @dataclass(frozen=True)
            class Same:
                """The bug: every task's source is the same stream."""

                seed: int

                def source(self, task: str) -> SecureRandom:
                    return SecureRandom.from_seed(self.seed)

            keys = Same(seed)
        chunks = dask_release.record_release(
            client,
            parts,
            columns,
            transform,
            mixture_degree=ell,
            n_samples=T,
            sigma_x=1.0,
            sigma_y=1.0,
            noise=Identity(),
            keys=keys,
        )
        x = np.concatenate([c[0].numpy() for c in chunks]) * ell
        dist.append(_pair_counts(np.rint(x), n))
        xs, _ = _single_record(X, labels, 1, ell=ell, T=T, noise=lambda v, **_: v, seed=100 + seed)
        # _single_record preprocesses with C = 4: one-hot rows become ¼.
        single.append(_pair_counts(np.rint(xs * ell * C), n))
    a, b = np.concatenate(dist), np.concatenate(single)
    top = int(max(a.max(), b.max())) + 1
    table = np.array(
        [np.bincount(a.astype(int), minlength=top), np.bincount(b.astype(int), minlength=top)]
    )
    table = table[:, table.sum(axis=0) > 0]
    p = stats.chi2_contingency(table).pvalue
    # Aligned pairs (record i and i + 20: same offset in neighbouring partitions).
    i, j = np.triu_indices(n, 1)
    aligned = a.reshape(6, -1)[:, (j - i) == rows].mean()
    if bug:
        assert aligned > 1.5  # they share all their k = 3 mixtures
    else:
        assert p > 1e-3
        assert aligned < 0.5  # E = k²/T ≈ 0.15 shared mixtures


CDA = {"n": 3000, "d": 4, "K": 3, "rows": 800, "ell": 4, "T": 6000, "sigma": 0.15}


def _cda_statistics(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per mixture of class 0: the share of its members from the first half, plus noise."""
    return {"first_half": x[y[:, 0] == 1, 0]}


def test_dpcda_law_matches_single_machine(client: Any, tmp_path: Any) -> None:
    X, labels = _dataset(CDA["n"], CDA["d"], CDA["K"], seed=4)
    parts, columns, _ = _stored(tmp_path, X, labels, CDA["rows"], CDA["K"])
    d = CDA["d"]
    transform = RowTransform.unit_range(np.zeros(d), np.ones(d), 1.0, divide=False)
    facts = PublicFacts(n=CDA["n"], n_features=d, n_classes=CDA["K"])
    params = {
        "mixture_degree": CDA["ell"],
        "n_samples": CDA["T"],
        "min_class_size": 10,
        "standardization": "unit_range",
        "clip_norm": 1.0,
    }
    declared = NoiseSpec("fast", noise_for("dpcda", params, facts, sigma=CDA["sigma"]))
    kwargs = dict(
        mixture_degree=CDA["ell"],
        n_samples=CDA["T"],
        sigma=CDA["sigma"],
        clip_norm=1.0,
        nonnegative=True,
    )

    def run(noise: Any, seed: int) -> dict[str, np.ndarray]:
        out = list(
            dask_release.class_release(
                client, parts, columns, transform, noise=noise, keys=SeededKeys(seed), **kwargs
            )
        )
        return _cda_statistics(
            np.concatenate([o[0].numpy() for o in out]), np.concatenate([o[1].numpy() for o in out])
        )

    features = torch.as_tensor(transform.rows(X), dtype=torch.float32)
    gen = SecureRandom.from_seed(40)
    want = list(
        cda_generate(
            features,
            torch.as_tensor(labels),
            n_classes=CDA["K"],
            generator=gen,
            noise=FastNoise(gen),
            **kwargs,
        )
    )
    reference = _cda_statistics(
        np.concatenate([w[0].numpy() for w in want]), np.concatenate([w[1].numpy() for w in want])
    )
    assert _worst_p(run(declared, 41), reference) > 1e-3
    for bug in (Scaled(2.0), Scaled(0.0)):
        assert _worst_p(run(bug, 41), reference) < 1e-6


# --- (c) the noise declared is the noise added ----------------------------------------------


def test_record_noise_bounds_are_the_single_machine_ones() -> None:
    n, d, K, ell, T = 500, 3, 2, 4, 300
    X, labels = _dataset(n, d, K, seed=5)
    rec = Recorder()
    _single_record(X, labels, K, ell=ell, T=T, noise=rec, seed=1, sigma=(0.3, 0.7))
    plan = record.RecordPlan.make(n=n, mixture_degree=ell, n_samples=T, dim_x=d, dim_y=K)
    dx, dy, ex, ey = plan.noise_bounds()
    assert set(rec.calls) == {(0.3, dx, ex), (0.7, dy, ey)}


def test_dpcda_noise_bounds_are_the_single_machine_ones() -> None:
    n, d, K, ell = 500, 3, 2, 4
    X, labels = _dataset(n, d, K, seed=6)
    rec = Recorder()
    # The reducers sum in float64, as the single machine does for float64 rows (float32 rows
    # it sums in float32 blocks, with a larger bound): the stored float32 values, as float64.
    features = torch.as_tensor(X / 2, dtype=torch.float32).double()
    for nonnegative in (True, False):
        list(
            cda_generate(
                features,
                torch.as_tensor(labels),
                n_classes=K,
                mixture_degree=ell,
                n_samples=40,
                sigma=0.3,
                clip_norm=1.0,
                nonnegative=nonnegative,
                generator=SecureRandom.from_seed(0),
                noise=rec,
            )
        )
        assert set(rec.calls) == {
            (0.3, *classes.noise_bounds(clip_norm=1.0, mixture_degree=ell, nonnegative=nonnegative))
        }
        rec.calls.clear()


def test_reducers_refuse_undeclared_noise(client: Any, tmp_path: Any) -> None:
    n, d, K = 3000, 4, 2
    X, labels = _dataset(n, d, K, seed=7)
    parts, columns, transform = _stored(tmp_path, X, labels, 1000, K)
    declared = _declared_record((0.5, 0.5))
    x, _ = _record(
        client, parts, columns, transform, ell=4, T=300, noise=declared, seed=1, sigma=(0.5, 0.5)
    )
    assert x.shape == (300, d)
    with pytest.raises(UndeclaredNoise):
        _record(
            client,
            parts,
            columns,
            transform,
            ell=4,
            T=300,
            noise=declared,
            seed=1,
            sigma=(0.25, 0.5),
        )
    # Sensitivities: the declared ones bound the reducers' (same accountant, unchanged).
    plan = record.RecordPlan.make(n=n, mixture_degree=4, n_samples=300, dim_x=d, dim_y=K)
    dx, dy, _, _ = plan.noise_bounds()
    scales = {s.name: s for s in declared.declared.scales}
    assert scales["features"].sensitivity >= dx and scales["labels"].sensitivity >= dy


# --- the spec's hook: the job a mechanism builds -------------------------------------------


def test_spec_jobs_match_the_releases_and_run(client: Any, tmp_path: Any) -> None:
    """``Execution.distributed`` builds the job from public declarations with the
    transform the single-machine release uses, refuses what the engine lacks, and the job
    runs on the cluster with the declared noise."""
    from dpcore.distributed.jobs import ClassJob, Declared, RecordJob, Unsupported
    from dpcore.mechanisms import registry
    from dpcore.mechanisms.run import params_of

    n, d, K = 3000, 4, 2
    X, labels = _dataset(n, d, K, seed=9)
    parts, columns, _ = _stored(tmp_path, X, labels, 1000, K)
    declared = Declared(np.zeros(d), np.ones(d), (d,), K)
    facts = PublicFacts(n=n, n_features=d, n_classes=K)
    dpmix, dpcda = registry.get("dpmix"), registry.get("dpcda")
    assert dpmix.execution.distributed is not None and dpcda.execution.distributed is not None

    raw = {"mixture_degree": 4, "n_samples": 200, "assignment": "record", "clip_norm": 1.5}
    noise = noise_for("dpmix", raw, facts, sigma=0.5, sigma_y=0.25)
    job = dpmix.execution.distributed(params_of(dpmix, raw), declared, noise)
    assert isinstance(job, RecordJob) and (job.sigma_x, job.sigma_y) == (0.5, 0.25)
    release_transform = RowTransform.unit_range(np.zeros(d), np.ones(d), 1.5)
    np.testing.assert_array_equal(job.transform.rows(X), release_transform.rows(X))
    rows = list(
        dask_release.run_job(
            client, job, parts, columns, noise=NoiseSpec("secure", noise), keys=SeededKeys(1)
        )
    )
    assert sum(x.shape[0] for x, _ in rows) == 200
    with pytest.raises(Unsupported):
        dpmix.execution.distributed(
            params_of(dpmix, {**raw, "assignment": "mixture"}), declared, noise
        )

    raw = {
        "mixture_degree": 4,
        "n_samples": 200,
        "min_class_size": 10,
        "standardization": "unit_range",
        "clip_norm": 1.0,
        "class_sizes": "declared",  # the job implements declared class sizes only
    }
    noise = noise_for("dpcda", raw, facts, sigma=0.5)
    job = dpcda.execution.distributed(params_of(dpcda, raw), declared, noise)
    assert isinstance(job, ClassJob) and job.nonnegative and job.sigma == 0.5
    rows = list(
        dask_release.run_job(
            client, job, parts, columns, noise=NoiseSpec("fast", noise), keys=SeededKeys(2)
        )
    )
    assert sum(x.shape[0] for x, _ in rows) == 200
    with pytest.raises(ValueError, match="min_class_size"):
        big = dpcda.execution.distributed(
            params_of(dpcda, {**raw, "min_class_size": 5000}), declared, noise
        )
        list(
            dask_release.run_job(
                client, big, parts, columns, noise=NoiseSpec("fast", noise), keys=SeededKeys(2)
            )
        )
    with pytest.raises(Unsupported):
        dpcda.execution.distributed(
            params_of(dpcda, {**raw, "standardization": "dp", "stats_noise": 1.0}), declared, noise
        )
    with pytest.raises(Unsupported, match="DP class sizes"):
        dpcda.execution.distributed(params_of(dpcda, {**raw, "class_sizes": "dp"}), declared, noise)


def test_partial_sums_run_in_dataset_order_whatever_the_draw_order() -> None:
    """A mixture's partial sum in a partition adds its members in dataset order, so its bits
    are a function of its member set: values whose float64 sum depends on the order (1e16,
    1, −1e16, 1) give the dataset-order result for every order the ranks are drawn in."""
    values = np.array([[1e16], [1.0], [-1e16], [1.0]])
    labels = np.zeros(4, dtype=np.int64)
    index = classes.index_partition(values, labels, n_classes=1, nonnegative=False)
    where = classes.offsets([classes.class_counts(index)])
    v = values.astype(np.float32).astype(np.float64)[:, 0]  # as the partition stores them
    in_order = ((v[0] + v[1]) + v[2]) + v[3]  # float64, dataset order
    assert in_order != ((v[1] + v[3]) + v[0]) + v[2]  # the order shows in the bits
    for drawn in itertools.permutations(range(4)):
        request = classes.route(np.array([drawn]), 0, where)[0]
        np.testing.assert_array_equal(request.rank, np.arange(4))
        part = classes.gather(index, 0, request)
        assert part.sums[0, 0] == in_order
    # Two mixtures listed together: each keeps its own members, each in dataset order.
    request = classes.route(np.array([[3, 1], [2, 0]]), 0, where)[0]
    np.testing.assert_array_equal(request.mixture, [0, 0, 1, 1])
    np.testing.assert_array_equal(request.rank, [1, 3, 0, 2])


def test_routing_is_the_stable_sort_bijection() -> None:
    """Every class rank r is routed to the record the single machine's stable argsort of all
    labels puts at rank r; ranks beyond a partition's records are refused."""
    rng = np.random.default_rng(3)
    sizes, K = [7, 0, 12, 5], 3
    labels = rng.integers(0, K, sum(sizes))
    ids = np.arange(labels.size, dtype=np.float32)[:, None]  # a record's feature: its index
    bounds = np.cumsum([0, *sizes])
    indexes = [
        classes.index_partition(ids[a:z], labels[a:z], n_classes=K, nonnegative=True)
        for a, z in itertools.pairwise(bounds)
    ]
    where = classes.offsets([classes.class_counts(i) for i in indexes])
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=K))])
    for c in range(K):
        ranks = np.arange(starts[c + 1] - starts[c])[:, None]  # one "mixture" per rank
        found = np.full(ranks.shape[0], -1.0)
        for p, request in classes.route(ranks, c, where).items():
            part = classes.gather(indexes[p], c, request)
            found[part.ids] = part.sums[:, 0]
        np.testing.assert_array_equal(found, order[starts[c] : starts[c + 1]])
    with pytest.raises(ValueError, match="beyond"):
        classes.route(np.array([[int(where[-1, 0])]]), 0, where)
    bad = classes.Request(np.array([0]), np.array([int(classes.class_counts(indexes[0])[0])]))
    with pytest.raises(ValueError, match="beyond"):
        classes.gather(indexes[0], 0, bad)


def test_local_cluster_serves_no_metrics(client: Any) -> None:
    """Task timings reveal private class counts (DP-CDA's gathers): the LocalCluster's
    scheduler and workers serve no HTTP route (no dashboard, no /metrics)."""
    import urllib.error
    import urllib.request

    servers = [client.cluster.scheduler, *client.cluster.workers.values()]
    for server in servers:
        port = next(iter(server.http_server._sockets.values())).getsockname()[1]
        for route in ("metrics", "status", "health"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/{route}", timeout=5)
            assert err.value.code == 404
