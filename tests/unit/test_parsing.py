"""service.datasets.parsing: formats, validation messages, label indexing, bounds and clipping."""

from __future__ import annotations

import dataclasses
import io
import time
import zipfile
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.datasets import parse_limits
from service.datasets.parsing import (
    SUPPORTED_FORMATS,
    ParsedDataset,
    detect_format,
    parse_dataset,
)
from service.datasets.schemas import DatasetMetadata
from service.errors import DatasetTooLarge, InvalidInput
from tests import mnist

LIMIT = 10_000_000


def meta(**fields: Any) -> DatasetMetadata:
    fields.setdefault("feature_range", [0, 10])
    return DatasetMetadata.model_validate(
        {"name": "d", "budget": {"epsilon": 1.0, "delta": 1e-5}, **fields}
    )


def parse(content: bytes, filename: str, *, max_bytes: int = LIMIT, **fields: Any) -> ParsedDataset:
    return parse_dataset(
        content=content, filename=filename, metadata=meta(**fields), max_bytes=max_bytes
    )


def csv(text: str, **fields: Any) -> ParsedDataset:
    fields.setdefault("label_column", "y")
    return parse(text.encode(), "data.csv", **fields)


def parquet_bytes(table: pa.Table | pd.DataFrame) -> bytes:
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def parquet(table: pa.Table | pd.DataFrame, **fields: Any) -> ParsedDataset:
    fields.setdefault("label_column", "y")
    return parse(parquet_bytes(table), "data.parquet", **fields)


def npz_bytes(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def npz(**fields: Any) -> ParsedDataset:
    arrays = {k: fields.pop(k) for k in ("X", "y") if k in fields}
    return parse(npz_bytes(**arrays), "data.npz", **fields)


# --- format detection, size, unreadable bytes ------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "fmt"),
    [
        ("a.csv", "csv"),
        ("dir/a.b.CSV", "csv"),
        ("a.parquet", "parquet"),
        ("a.pq", "parquet"),
        ("a.npz", "npz"),
    ],
)
def test_detect_format_by_extension(filename: str, fmt: str) -> None:
    assert detect_format(filename) == fmt
    assert fmt in SUPPORTED_FORMATS


@pytest.mark.parametrize("filename", ["a.json", "a.npy", "csv", "a.csv.gz", ""])
def test_detect_format_rejects_unknown_extension_listing_supported(filename: str) -> None:
    with pytest.raises(InvalidInput, match="supported formats: csv, parquet, npz"):
        detect_format(filename)


def test_unknown_extension_is_rejected_by_parse_too() -> None:
    with pytest.raises(InvalidInput, match=r"cannot tell the format of 'x\.txt'"):
        parse(b"a,y\n1,0\n", "x.txt", label_column="y")


def test_file_over_the_limit_names_size_and_limit() -> None:
    content = b"a,y\n1,0\n2,1\n"
    with pytest.raises(InvalidInput, match=r"file is 12 bytes; the limit is 11 bytes") as info:
        parse(content, "a.csv", max_bytes=11, label_column="y")
    assert info.value.detail == {"size_bytes": 12, "limit_bytes": 11}
    assert parse(content, "a.csv", max_bytes=12, label_column="y").n_rows == 2


@pytest.mark.parametrize("filename", ["a.csv", "a.parquet", "a.npz"])
def test_empty_file(filename: str) -> None:
    with pytest.raises(InvalidInput, match="file is empty"):
        parse(b"", filename, label_column="y")


def test_garbage_csv_is_unreadable() -> None:
    with pytest.raises(InvalidInput, match="file could not be read as csv: "):
        parse(b"\xff\xfe\x00\x81garbage\x00\xc3", "a.csv", label_column="y")


def test_ragged_csv_is_unreadable_with_parser_reason() -> None:
    with pytest.raises(
        InvalidInput,
        match=r"could not be read as csv: line 3 of the file has 4 fields where the header has 2",
    ):
        csv("a,y\n1,0\n1,2,3,4\n")


def test_garbage_and_truncated_parquet_are_unreadable() -> None:
    with pytest.raises(InvalidInput, match="file could not be read as parquet: "):
        parse(b"a,y\n1,0\n", "a.parquet", label_column="y")
    whole = parquet_bytes(pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1]}))
    with pytest.raises(InvalidInput, match="file could not be read as parquet: "):
        parse(whole[: len(whole) // 2], "a.parquet", label_column="y")


def test_npz_that_is_not_a_zip() -> None:
    with pytest.raises(InvalidInput, match="could not be read as npz: it is not a zip archive"):
        parse(b"definitely not a zip", "a.npz")


def test_single_npy_instead_of_npz_says_so() -> None:
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 2)))
    with pytest.raises(InvalidInput, match=r"single \.npy array; save X and y together"):
        parse(buf.getvalue(), "a.npz")


def test_truncated_npz_is_unreadable() -> None:
    whole = npz_bytes(X=np.zeros((4, 3)), y=np.array([0, 1, 0, 1]))
    with pytest.raises(InvalidInput, match="could not be read as npz"):
        parse(whole[:-40], "a.npz")


def test_npz_object_array_is_refused_without_unpickling() -> None:
    content = npz_bytes(X=np.array([[{"a": 1}], [None]], dtype=object), y=np.array([0, 1]))
    with pytest.raises(InvalidInput, match=r"could not be read as npz: .*allow_pickle=False"):
        parse(content, "a.npz")


def test_npz_member_that_is_not_npy() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("X.npy", b"not an array")
        zf.writestr("y.npy", b"nor this")
    with pytest.raises(InvalidInput, match="could not be read as npz"):
        parse(buf.getvalue(), "a.npz")


# --- CSV -------------------------------------------------------------------------------------


def test_csv_happy_path_values_clipping_and_labels() -> None:
    parsed = csv(
        "b,y,a\n"  # label column in the middle: features keep file order around it
        "1,cat,-3\n"
        "12,dog,4.5\n"
        "5,cat,11\n",
        feature_range=[0, 10],
    )
    assert parsed.feature_names == ["b", "a"]
    assert parsed.feature_shape == (2,)
    assert (parsed.n_rows, parsed.n_features) == (3, 2)
    assert parsed.X.dtype == np.float64
    np.testing.assert_array_equal(parsed.X, [[1, 0], [10, 4.5], [5, 10]])
    assert parsed.clipped_values == 3  # 12 -> 10, -3 -> 0, 11 -> 10
    assert parsed.classes == ["cat", "dog"]
    assert parsed.classes_declared is False
    assert parsed.labels.dtype == np.int64
    np.testing.assert_array_equal(parsed.labels, [0, 1, 0])
    np.testing.assert_array_equal(parsed.lo, [0, 0])
    np.testing.assert_array_equal(parsed.hi, [10, 10])


def test_csv_integer_labels_are_ints_sorted_numerically() -> None:
    parsed = csv("a,y\n1,10\n2,9\n3,10\n4,-1\n")
    assert parsed.classes == [-1, 9, 10]
    assert all(type(c) is int for c in parsed.classes)
    np.testing.assert_array_equal(parsed.labels, [2, 1, 2, 0])


def test_values_on_the_bounds_are_not_counted_as_clipped() -> None:
    parsed = csv("a,y\n0,0\n10,1\n10.000001,1\n", feature_range=[0, 10])
    assert parsed.clipped_values == 1
    np.testing.assert_array_equal(parsed.X[:, 0], [0, 10, 10])


def test_table_formats_need_label_column() -> None:
    with pytest.raises(InvalidInput, match="csv uploads need `label_column`"):
        parse(b"a,y\n1,0\n", "a.csv")
    with pytest.raises(InvalidInput, match="parquet uploads need `label_column`"):
        parse(parquet_bytes(pd.DataFrame({"a": [1], "y": [0]})), "a.parquet")


def test_missing_label_column_lists_available_columns() -> None:
    with pytest.raises(
        InvalidInput, match=r"label column 'label' is not in the file; its columns are \['a', 'y'\]"
    ):
        csv("a,y\n1,0\n", label_column="label")


def test_header_only_csv_has_no_rows() -> None:
    with pytest.raises(InvalidInput, match="file has no rows"):
        csv("a,y\n")


def test_label_column_alone_is_no_features() -> None:
    with pytest.raises(InvalidInput, match="no feature columns besides the label column 'y'"):
        csv("y\n0\n1\n")


def test_non_numeric_feature_names_column_row_and_value() -> None:
    rows = "".join(f"{i},0\n" for i in range(16)) + "abc,1\n"
    with pytest.raises(
        InvalidInput, match=r"column 'age' holds non-numeric values \(first bad row 17: 'abc'\)"
    ):
        csv("age,y\n" + rows)


# the second file has a gap, which pandas reads as an object column of True and NaN
@pytest.mark.parametrize("text", ["flag,y\nTrue,0\nFalse,1\n", "flag,y\nTrue,0\n,1\n"])
def test_boolean_feature_column_is_rejected(text: str) -> None:
    with pytest.raises(InvalidInput, match="column 'flag' holds booleans"):
        csv(text)


def test_missing_feature_value_names_column_and_row() -> None:
    with pytest.raises(InvalidInput, match="column 'b' is missing a value in row 2"):
        csv("a,b,y\n1,2,0\n3,,1\n")


def test_infinite_feature_value_names_column_and_row() -> None:
    with pytest.raises(InvalidInput, match="column 'a' holds an infinite value in row 3"):
        csv("a,y\n1,0\n2,1\ninf,0\n")


def test_missing_label_names_row() -> None:
    with pytest.raises(InvalidInput, match="label column 'y' is missing a value in row 2"):
        csv("a,y\n1,0\n2,\n3,1\n")


def test_whole_number_float_labels_are_ints() -> None:
    parsed = csv("a,y\n1,1.0\n2,0.0\n")
    assert parsed.classes == [0, 1]
    assert all(type(c) is int for c in parsed.classes)
    np.testing.assert_array_equal(parsed.labels, [1, 0])


def test_fractional_label_is_rejected() -> None:
    with pytest.raises(InvalidInput, match=r"label 0\.5 in row 2 is not a whole number"):
        csv("a,y\n1,1.0\n2,0.5\n")


def test_boolean_labels_are_rejected() -> None:
    with pytest.raises(InvalidInput, match="label column 'y' holds booleans"):
        csv("a,y\n1,True\n2,False\n")


# --- classes ---------------------------------------------------------------------------------


def test_declared_classes_keep_declared_order_and_may_be_absent() -> None:
    parsed = csv("a,y\n1,0\n2,2\n3,0\n", classes=[2, 1, 0])
    assert parsed.classes == [2, 1, 0]
    assert parsed.classes_declared is True
    np.testing.assert_array_equal(parsed.labels, [2, 0, 2])


def test_label_outside_declared_classes_names_label_row_and_set() -> None:
    with pytest.raises(
        InvalidInput, match=r"label 7 in row 3 is not among the declared classes \[0, 1\]"
    ):
        csv("a,y\n1,0\n2,1\n3,7\n4,7\n", classes=[0, 1])


def test_one_class_without_declaration_asks_for_classes() -> None:
    with pytest.raises(InvalidInput, match=r"found only one class \(5\).*declare `classes`"):
        csv("a,y\n1,5\n2,5\n")


def test_one_class_present_is_fine_when_classes_are_declared() -> None:
    parsed = csv("a,y\n1,5\n2,5\n", classes=[5, 6])
    np.testing.assert_array_equal(parsed.labels, [0, 0])


def test_csv_string_classes_read_labels_as_text() -> None:
    # "001" would otherwise be parsed as the integer 1
    parsed = csv("a,y\n1,001\n2,1\n", classes=["1", "001"])
    assert parsed.classes == ["1", "001"]
    np.testing.assert_array_equal(parsed.labels, [1, 0])


def test_csv_mixed_declared_classes_match_by_text() -> None:
    parsed = csv("a,y\n1,0\n2,cat\n", classes=[0, "cat"])
    assert parsed.classes == [0, "cat"]
    np.testing.assert_array_equal(parsed.labels, [0, 1])


def test_csv_text_labels_match_int_classes_by_text() -> None:
    # one non-numeric label makes pandas read the whole column as text; "0" still matches 0
    with pytest.raises(InvalidInput, match=r"label 'cat' in row 2 is not among .*\[0, 1\]"):
        csv("a,y\n1,0\n2,cat\n", classes=[0, 1])


def test_parquet_compares_labels_by_type() -> None:
    table = pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1]})
    with pytest.raises(InvalidInput, match=r"label 0 in row 1 .*labels in this file are integers"):
        parquet(table, classes=["0", "1"])
    assert parquet(table, classes=[1, 0]).labels.tolist() == [1, 0]


# --- feature_range ---------------------------------------------------------------------------


def test_per_feature_ranges_clip_each_column() -> None:
    parsed = csv(
        "a,b,y\n-1,5,0\n0.5,20,1\n2,-5,0\n",
        feature_range={"b": [0, 10], "a": [0, 1]},
    )
    np.testing.assert_array_equal(parsed.lo, [0, 0])
    np.testing.assert_array_equal(parsed.hi, [1, 10])
    np.testing.assert_array_equal(parsed.X, [[0, 5], [0.5, 10], [1, 0]])
    assert parsed.clipped_values == 4


def test_per_feature_ranges_must_cover_every_feature() -> None:
    with pytest.raises(InvalidInput, match=r"no range for 1 feature\(s\): \['b'\]"):
        csv("a,b,y\n1,2,0\n3,4,1\n", feature_range={"a": [0, 1]})


def test_per_feature_ranges_must_not_name_unknown_columns() -> None:
    with pytest.raises(InvalidInput, match=r"2 name\(s\) that are not features: \['y', 'z'\]"):
        csv("a,y\n1,0\n2,1\n", feature_range={"a": [0, 1], "y": [0, 1], "z": [0, 1]})


def test_npz_per_feature_ranges_use_flat_indices() -> None:
    X = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]])
    ranges = {str(i): [0, 2 * (i + 1)] for i in range(4)}  # hi: 2, 4, 6, 8
    parsed = npz(X=X, y=np.array([0, 1]), feature_range=ranges)
    np.testing.assert_array_equal(parsed.X, [[1, 2, 3, 4], [2, 4, 6, 8]])
    assert parsed.clipped_values == 3


# --- Parquet ---------------------------------------------------------------------------------


def test_parquet_happy_path() -> None:
    table = pa.table(
        {
            "x1": pa.array([1, 2, 30], pa.int32()),
            "y": ["b", "a", "b"],
            "x2": pa.array([0.5, -1.0, 2.0], pa.float32()),
        }
    )
    parsed = parquet(table, feature_range=[0, 10])
    assert parsed.feature_names == ["x1", "x2"]
    np.testing.assert_array_equal(parsed.X, [[1, 0.5], [2, 0], [10, 2]])
    assert parsed.clipped_values == 2
    assert parsed.classes == ["a", "b"]
    np.testing.assert_array_equal(parsed.labels, [1, 0, 1])


def test_parquet_string_feature_column() -> None:
    table = pa.table({"x": ["1.5", "two"], "y": [0, 1]})
    with pytest.raises(InvalidInput, match=r"column 'x' holds non-numeric values .*row 2: 'two'"):
        parquet(table)


def test_parquet_boolean_feature_column() -> None:
    with pytest.raises(InvalidInput, match="column 'ok' holds booleans"):
        parquet(pa.table({"ok": [True, False], "y": [0, 1]}))


def test_parquet_null_feature_and_null_label() -> None:
    with pytest.raises(InvalidInput, match="column 'x' is missing a value in row 2"):
        parquet(pa.table({"x": [1.0, None], "y": [0, 1]}))
    with pytest.raises(InvalidInput, match="label column 'y' is missing a value in row 1"):
        parquet(pa.table({"x": [1.0, 2.0], "y": pa.array([None, "a"], pa.string())}))


def test_parquet_float_labels() -> None:
    parsed = parquet(pa.table({"x": [1.0, 2.0], "y": [1.0, 0.0]}))
    assert parsed.classes == [0, 1]
    with pytest.raises(InvalidInput, match=r"label 1\.5 in row 1 is not a whole number"):
        parquet(pa.table({"x": [1.0, 2.0], "y": [1.5, 0.0]}))


def test_parquet_empty_table_has_no_rows() -> None:
    table = pa.table({"x": pa.array([], pa.float64()), "y": pa.array([], pa.int64())})
    with pytest.raises(InvalidInput, match="file has no rows"):
        parquet(table)


def test_parquet_duplicate_column_names() -> None:
    table = pa.Table.from_arrays([pa.array([1.0]), pa.array([2.0]), pa.array([0])], ["a", "a", "y"])
    with pytest.raises(InvalidInput, match="column name 'a' appears more than once"):
        parquet(table)


def test_parquet_that_decodes_to_too_many_values() -> None:
    n = 200_000
    content = parquet_bytes(pa.table({"x": np.zeros(n), "y": np.arange(n) % 2}))
    assert len(content) < n  # compresses far below one byte per value
    with pytest.raises(InvalidInput, match=f"= {2 * n} values; the limit is {n} values"):
        parse(content, "a.parquet", max_bytes=n, label_column="y")


# --- NPZ -------------------------------------------------------------------------------------


def test_npz_image_shaped_features() -> None:
    X = np.arange(3 * 4 * 5, dtype=np.int16).reshape(3, 4, 5)
    parsed = npz(X=X, y=np.array([1, 0, 1], dtype=np.uint8), feature_range=[0, 50])
    assert parsed.feature_shape == (4, 5)
    assert (parsed.n_rows, parsed.n_features) == (3, 20)
    assert parsed.feature_names == [str(i) for i in range(20)]
    assert parsed.X.dtype == np.float64
    np.testing.assert_array_equal(parsed.X, np.minimum(X.reshape(3, 20), 50))
    assert parsed.clipped_values == 9  # 51..59
    assert parsed.classes == [0, 1]
    np.testing.assert_array_equal(parsed.labels, [1, 0, 1])


def test_npz_string_labels_and_declared_classes() -> None:
    parsed = npz(X=np.ones((3, 2)), y=np.array(["dog", "cat", "dog"]), classes=["dog", "cat"])
    assert parsed.classes == ["dog", "cat"]
    np.testing.assert_array_equal(parsed.labels, [0, 1, 0])
    with pytest.raises(InvalidInput, match=r"label 'cow' at y\[1\] is not among"):
        npz(X=np.ones((2, 2)), y=np.array(["dog", "cow"]), classes=["dog", "cat"])


def test_npz_float_labels() -> None:
    assert npz(X=np.ones((2, 2)), y=np.array([1.0, 0.0])).classes == [0, 1]
    with pytest.raises(InvalidInput, match=r"label 0\.25 at y\[1\] is not a whole number"):
        npz(X=np.ones((2, 2)), y=np.array([1.0, 0.25]))


def test_npz_missing_arrays_are_named() -> None:
    with pytest.raises(
        InvalidInput, match=r"no array named 'y'; it needs 'X' .* and holds \['X', 'labels'\]"
    ):
        parse(npz_bytes(X=np.ones((2, 2)), labels=np.array([0, 1])), "a.npz")
    with pytest.raises(InvalidInput, match="no array named 'X' or 'y'"):
        parse(npz_bytes(data=np.ones((2, 2))), "a.npz")


def test_npz_row_count_mismatch() -> None:
    with pytest.raises(InvalidInput, match="X has 5 rows but y has 4 labels"):
        npz(X=np.ones((5, 2)), y=np.zeros(4, dtype=int))


def test_npz_without_rows() -> None:
    with pytest.raises(InvalidInput, match="file has no rows"):
        npz(X=np.ones((0, 2)), y=np.zeros(0, dtype=int))


def test_npz_shapes() -> None:
    with pytest.raises(InvalidInput, match=r"X must have shape \(n, features...\).*\(4,\)"):
        npz(X=np.ones(4), y=np.array([0, 1, 0, 1]))
    with pytest.raises(InvalidInput, match=r"y must be 1-D .*\(2, 1\)"):
        npz(X=np.ones((2, 2)), y=np.array([[0], [1]]))
    with pytest.raises(InvalidInput, match="X has no features"):
        npz(X=np.ones((2, 0)), y=np.array([0, 1]))


def test_npz_dtypes() -> None:
    with pytest.raises(InvalidInput, match="X holds booleans"):
        npz(X=np.ones((2, 2), dtype=bool), y=np.array([0, 1]))
    with pytest.raises(InvalidInput, match="X must hold integers or floats, not complex128"):
        npz(X=np.ones((2, 2), dtype=complex), y=np.array([0, 1]))
    with pytest.raises(InvalidInput, match="y must hold integers or strings"):
        npz(X=np.ones((2, 2)), y=np.array([True, False]))


def test_npz_non_finite_features_name_the_row() -> None:
    X = np.ones((4, 3))
    X[2, 1] = np.nan
    X[3, 0] = np.inf
    with pytest.raises(
        InvalidInput, match=r"X\[2\] holds NaN or infinity \(flat feature index 1\)"
    ):
        npz(X=X, y=np.array([0, 1, 0, 1]))


def test_npz_compression_cannot_exceed_the_limit() -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, X=np.zeros((1000, 100)), y=np.arange(1000) % 2)
    content = buf.getvalue()
    assert len(content) < 100_000
    with pytest.raises(InvalidInput, match=r"X and y take \d+ bytes uncompressed; the limit"):
        parse(content, "a.npz", max_bytes=100_000)


def test_parse_leaves_the_input_alone_and_result_is_frozen() -> None:
    X = np.full((2, 3), 100.0)
    content = npz_bytes(X=X, y=np.array([0, 1]))
    before = bytes(content)
    parsed = parse(content, "a.npz", feature_range=[0, 1])
    assert content == before
    assert parsed.clipped_values == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.clipped_values = 0  # type: ignore[misc]


# --- real data -------------------------------------------------------------------------------


@pytest.mark.slow  # a wall-time assertion: kept out of make test-fast
@pytest.mark.skipif(not mnist.available(), reason="MNIST t10k files are not present")
def test_mnist_t10k_as_npz() -> None:
    images, labels = mnist.load_mnist_t10k()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,)
    content = npz_bytes(X=images, y=labels)

    start = time.perf_counter()
    parsed = parse(content, "mnist.npz", max_bytes=len(content), feature_range=[0, 255])
    elapsed = time.perf_counter() - start

    assert parsed.n_rows == 10000
    assert parsed.n_features == 784
    assert parsed.feature_shape == (28, 28)
    assert parsed.classes == list(range(10))
    assert parsed.clipped_values == 0
    np.testing.assert_array_equal(parsed.labels, labels)
    np.testing.assert_array_equal(parsed.X[17], images[17].reshape(-1))
    assert elapsed < 2.0  # typically ~0.03 s; a generous guard against accidental O(n·d) Python


# --- caps from metadata (issue 14, item 2a) --------------------------------------------------


def _capped(content: bytes, filename: str, **caps: int) -> ParsedDataset:
    return parse_dataset(
        content=content,
        filename=filename,
        metadata=meta(label_column="y", classes=[0, 1]),
        max_bytes=LIMIT,
        **caps,
    )


def test_parquet_decoded_bytes_estimated_from_the_footer(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 10_000
    content = parquet_bytes(pa.table({"x": np.zeros(n), "y": np.arange(n) % 2}))
    # x: float64, y: int64, each 8 bytes a row, plus a validity bit each.
    decoded = 2 * (8 * n + (n + 7) // 8)
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(DatasetTooLarge, match=f"take {decoded} bytes once decoded; the limit"):
        _capped(content, "a.parquet", max_decoded_bytes=decoded - 1)
    with pytest.raises(DatasetTooLarge, match=f"= {2 * n} values; the limit is {2 * n - 1}"):
        _capped(content, "a.parquet", max_cells=2 * n - 1)
    monkeypatch.undo()
    assert _capped(content, "a.parquet", max_cells=2 * n, max_decoded_bytes=decoded).n_rows == n


def test_npz_caps_read_from_the_headers() -> None:
    content = npz_bytes(X=np.zeros((50, 4), dtype=np.uint8), y=np.arange(50) % 2)
    with pytest.raises(DatasetTooLarge, match=r"X \(50, 4\) and y \(50,\) hold 250 values"):
        _capped(content, "a.npz", max_cells=249)
    with pytest.raises(DatasetTooLarge, match="take 600 bytes once decoded"):
        _capped(content, "a.npz", max_decoded_bytes=599)  # 200 uint8 + 50 int64
    assert _capped(content, "a.npz", max_cells=250, max_decoded_bytes=600).n_rows == 50


def test_csv_caps_stop_at_the_first_chunk_past_them() -> None:
    rows = parse_limits.CSV_CHUNK_ROWS + 10
    content = b"x,y\n" + b"1,0\n" * rows
    with pytest.raises(DatasetTooLarge, match=r"at least \d+ rows x 2 columns") as info:
        _capped(content, "a.csv", max_cells=2 * rows - 1)
    assert info.value.status_code == 413 and info.value.code == "dataset_too_large"
    assert _capped(content, "a.csv", max_cells=2 * rows).n_rows == rows


@pytest.mark.parametrize(
    ("dtype", "bounds", "clipped"),
    [
        (np.uint8, [0, 255], 0),  # the type's whole range: nothing to clip
        (np.uint8, [-1, 300], 0),
        (np.uint8, [10, 200], 6),  # narrower bounds still clip
        (np.int16, [0, 255], 2),  # a type wider than the bounds
    ],
)
def test_integer_npz_clips_only_what_its_bounds_exclude(
    dtype: Any, bounds: list[int], clipped: int
) -> None:
    values = [[0, 5, 255], [250, 201, 9]] if dtype == np.uint8 else [[-3, 5, 255], [250, 300, 9]]
    X = np.asarray(values, dtype=dtype)
    parsed = parse(npz_bytes(X=X, y=np.array([0, 1])), "data.npz", feature_range=bounds)
    assert parsed.clipped_values == clipped
    np.testing.assert_array_equal(parsed.X, np.clip(X.astype(np.float64), *bounds))
    assert parsed.X.dtype == np.float64
