"""Per-group sums (``dpcore.mechanisms.segments``): every row lands in its group, records of no
group cost the same work as the others, and no mechanism sums groups another way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.mechanisms import kmeans, moments, segments

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _identity(values: torch.Tensor, **_: Any) -> torch.Tensor:
    return values


_identity.name = "identity"  # type: ignore[attr-defined]


@pytest.mark.parametrize("force_sorted", [False, True])
def test_every_row_is_added_to_its_group(force_sorted: bool) -> None:
    rng = np.random.default_rng(4)
    index = rng.integers(0, 7, size=500)
    # Small integers: float64 sums are exact in any order, so both paths must match exactly.
    values = rng.integers(-50, 50, size=(500, 3)).astype(np.float64)
    expected = np.zeros((7, 3))
    np.add.at(expected, index, values)
    out = torch.zeros((7, 3), dtype=torch.float64)
    got = segments.segment_sum(
        out, torch.from_numpy(index), torch.from_numpy(values), force_sorted=force_sorted
    )
    assert got is out
    assert np.array_equal(got.numpy(), expected)


def test_records_of_no_group_go_to_the_extra_row() -> None:
    index = torch.tensor([2, -1, 0, -1, 1])
    assert segments.outside(index, 3).tolist() == [2, 3, 0, 3, 1]


class _Shapes:
    """Records the shape of every block of rows summed (the work done on them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[int, ...]] = []
        real = segments.segment_sum

        def recording(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> Any:
            self.seen.append(tuple(values.shape))
            return real(out, index, values)

        monkeypatch.setattr(segments, "segment_sum", recording)


def _rows(n: int = 240, k: int = 5) -> torch.Tensor:
    Z = torch.rand((n, k), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return Z / Z.norm(dim=1, keepdim=True).clamp_min(1.0) / 2


@pytest.mark.parametrize("pooled", [False, True])
def test_moments_work_the_same_however_many_records_have_no_cluster(
    monkeypatch: pytest.MonkeyPatch, pooled: bool
) -> None:
    Z = _rows()
    groups = torch.tensor([0, 1, 2])
    everyone = torch.arange(Z.shape[0]) % 3
    few = everyone.clone()
    few[: Z.shape[0] // 2] = -1  # half the records' class lost every centre
    shapes, results = [], []
    for assignment in (everyone, few):
        recorder = _Shapes(monkeypatch)
        scales = moments.Scales(counts=1.0, sums=1.0, second=1.0)
        stats = moments.noisy_moments(
            Z, assignment, groups, second_dim=3, tail=True, pooled=pooled, scales=scales,
            sampler=_identity, chunk=64,
        )  # fmt: skip
        shapes.append(recorder.seen)
        results.append(stats)
        monkeypatch.undo()
    assert shapes[0] == shapes[1] and shapes[0]
    # The kept records' statistics are those of the members alone, bit for bit.
    stats, member = results[1], few >= 0
    Zm, am = Z[member], few[member]
    for c in range(3):
        assert torch.equal(stats.sums[c], _ordered_sum(Zm[am == c]))
        assert float(stats.counts[c]) == float((am == c).sum())
    width = 3 * 4 // 2 + 2
    assert stats.second.shape == ((1, width) if pooled else (3, width))


def _ordered_sum(rows: torch.Tensor) -> torch.Tensor:
    """Rows added one after another, in row order (as the CPU's index_add_ does)."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for row in rows:
        total = total + row
    return total


def test_kmeans_statistics_work_the_same_however_many_records_have_no_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Z = _rows()
    everyone = torch.arange(Z.shape[0]) % 4
    few = everyone.clone()
    few[::3] = -1
    shapes, sums = [], []
    for assignment in (everyone, few):
        recorder = _Shapes(monkeypatch)
        noisy_sums, noisy_counts = kmeans.noisy_statistics(
            Z, assignment, 4, sigma_sums=1.0, sigma_counts=1.0, sampler=_identity, error=0.0,
            chunk=50,
        )  # fmt: skip
        shapes.append(recorder.seen)
        sums.append((noisy_sums, noisy_counts))
        monkeypatch.undo()
    assert shapes[0] == shapes[1] and shapes[0]
    member = few >= 0
    for c in range(4):
        rows = Z[member & (few == c)]
        torch.testing.assert_close(sums[1][0][c], rows.sum(0), rtol=0, atol=1e-12)
        assert float(sums[1][1][c]) == rows.shape[0]


def test_no_mechanism_sums_groups_another_way() -> None:
    """Sums that are noised go through segment_sum (deterministic on every device); the
    audit's own sums and the distributed engine's (CPU tensors of its partitions, whose
    order is fixed) are the only index_add_ left."""
    allowed = {
        "dpcore/mechanisms/segments.py",
        "dpcore/mechanisms/dpgm/audit.py",
        "dpcore/distributed/classes.py",
        "dpcore/distributed/record.py",
    }
    found = []
    for path in sorted((ROOT / "dpcore").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        for match in re.finditer(r"\.(index_add_?|scatter_add_?|index_put_)\(", text):
            if name not in allowed:
                found.append(f"{name}: {match.group(0)}")
    assert found == []
