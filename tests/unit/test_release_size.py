"""The size cap's estimate and a job's disk need (issue 14, item 2b): public figures only."""

from __future__ import annotations

import pytest

from dpcore.mechanisms.spec import InvalidParams, PublicFacts, ReleaseOverSizeCap
from worker.runner import disk_need

MNIST = PublicFacts(n=10_000, n_features=784, n_classes=10, max_release_bytes=2 * 1024**3)


def test_the_cap_counts_the_row_width() -> None:
    MNIST.check_rows(10_000)  # ~32 MB
    with pytest.raises(ReleaseOverSizeCap) as refused:
        MNIST.check_rows(10**7)
    assert isinstance(refused.value, InvalidParams)  # refused like any admission check
    assert refused.value.estimate == 10**7 * 794 * 4 == MNIST.release_bytes(10**7)
    assert refused.value.limit == 2 * 1024**3
    assert str(10**7 * 794 * 4) in str(refused.value)


def test_csv_takes_more_bytes_per_value() -> None:
    rows = 300_000
    MNIST.check_rows(rows)
    with pytest.raises(ReleaseOverSizeCap):
        PublicFacts(**{**MNIST.__dict__, "value_bytes": 16}).check_rows(rows)


def test_no_byte_cap_unless_set() -> None:
    PublicFacts(n=10, n_features=784, n_classes=10).check_rows(10**9)


def test_disk_need_counts_every_copy_a_job_writes() -> None:
    rows, width = 1000, 10
    assert disk_need(rows, width, "parquet", False) == rows * width * 4
    assert disk_need(rows, width, "npz", False) == rows * width * 4 * 2  # memory maps + zip
    assert disk_need(rows, width, "csv", False) == rows * width * 16
    # Post-processed: the raw file, the release file and a float32 scratch copy.
    assert disk_need(rows, width, "npz", True) == 2 * rows * width * 8 + rows * width * 4


def test_disk_need_counts_the_raw_copy_of_rows_mapped_into_the_domain() -> None:
    rows, width = 1000, 7
    assert disk_need(rows, width, "parquet", False, mapped=True) == 2 * rows * width * 4
    assert disk_need(rows, width, "npz", True, mapped=True) == disk_need(rows, width, "npz", True)
