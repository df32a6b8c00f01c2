"""Release files are written chunk by chunk with bounded memory, in all three formats."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dpcore.artifacts import ArtifactWriter, sha256_file
from dpcore.release_layout import Layout

META = {"mechanism": "dpmix", "release_id": "r1"}


def _layout(dim: int, kind: str = "proportions", classes: tuple[object, ...] = (0, 1)) -> Layout:
    return Layout.of([str(i) for i in range(dim)], "label", kind, classes)  # type: ignore[arg-type]


def _write(
    fmt: str,
    path: Path,
    rows: int,
    dim: int,
    chunk: int,
    seed: int = 0,
    on_settled: Callable[[int, tuple[int, int], bool], None] | None = None,
) -> None:
    rng = np.random.default_rng(seed)
    with ArtifactWriter(
        fmt,
        path,
        rows=rows,
        layout=_layout(dim),
        metadata=META,
        extra={"projection": np.eye(2)} if fmt == "npz" else None,
        on_settled=on_settled,
    ) as writer:
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            X = rng.standard_normal((count, dim)).astype(np.float32)
            X[:, 0] = np.arange(start, start + count)
            writer.write(X, np.ones((count, 2), dtype=np.float32))


def test_npz_memory_stays_bounded(tmp_path: Path) -> None:
    rows, dim, chunk = 50_000, 512, 1_000  # ~100 MB of features
    tracemalloc.start()
    _write("npz", tmp_path / "r.npz", rows, dim, chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 25 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    with np.load(tmp_path / "r.npz") as npz:
        assert npz["X"].shape == (rows, dim)
        assert (npz["X"][:, 0] == np.arange(rows)).all()
        assert json.loads(str(npz["metadata"])) == {**META, "layout": _layout(dim).describe()}
        assert (npz["projection"] == np.eye(2)).all()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tabular_round_trip(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"r.{fmt}"
    _write(fmt, path, 2_500, 3, 1_000)
    table = pq.read_table(path) if fmt == "parquet" else pacsv.read_csv(path)
    assert table.column_names == ["0", "1", "2", "label=0", "label=1"]
    assert table.num_rows == 2_500
    assert table.column("0").to_pylist()[:3] == [0.0, 1.0, 2.0]
    # The drawn labels were all ones: as proportions, a half each.
    assert set(table.column("label=1").to_pylist()) == {0.5}
    if fmt == "parquet":
        stored = json.loads(table.schema.metadata[b"dprelease"])
        assert stored == {**META, "layout": _layout(3).describe()}
    assert len(sha256_file(path)) == 64


def test_row_count_is_enforced(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="announced"):
        _write("npz", tmp_path / "r.npz", 10, 2, 4)  # writes 10 rows: fine
        with ArtifactWriter(
            "npz", tmp_path / "s.npz", rows=5, layout=_layout(1), metadata=META
        ) as writer:
            writer.write(np.zeros((3, 1)), np.zeros((3, 2)))
    assert not (tmp_path / "s.npz").exists()


@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_settled_bytes_never_change(tmp_path: Path, fmt: str) -> None:
    """What a writer says is final while it writes (``on_settled``) is what the finished file
    holds: the bytes an upload may send early. Only the NPZ holds a range back (the first zip
    entry's header, patched when the entry ends), and that range does change."""
    path = tmp_path / f"r.{fmt}"
    seen: list[tuple[int, tuple[int, int], bytes]] = []
    finished: list[int] = []

    def settled(end: int, held: tuple[int, int], final: bool) -> None:
        if final:
            finished.append(end)
        else:
            seen.append((end, held, path.read_bytes()[:end]))

    _write(fmt, path, 6_000, 40, 700, on_settled=settled)
    final = path.read_bytes()
    assert finished == [len(final)]  # the last report, once the file is closed
    assert len(seen) == 9  # one report per chunk
    assert seen[-1][0] > len(final) // 2  # most of the file was final before it was closed
    for end, (lo, hi), snapshot in seen:
        assert len(snapshot) == end <= len(final)
        assert snapshot[:lo] == final[:lo] and snapshot[hi:] == final[hi:end]
    held = {held for _, held, _ in seen}
    if fmt == "npz":
        ((lo, hi),) = held
        assert lo == 0 and 30 < hi < 200  # the local header of X.npy
        assert seen[0][2][lo:hi] != final[lo:hi]  # patched at the entry's end
    else:
        assert held == {(0, 0)}  # appended only
