"""The raw-units row transform (issue 15, item 2): rows inside the norm bound are released
exactly, every mechanism still reads rows its accountant's sensitivity covers whatever C is,
and the metadata is enough to map real records alike."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpcore import preprocessing
from dpcore.mechanisms import registry
from dpcore.mechanisms.class_mixing import record_distance
from dpcore.mechanisms.clipping import check_clip_norm, default_clip_norm
from dpcore.mechanisms.dpmix.accounting import FEATURE_SENSITIVITY
from dpcore.mechanisms.spec import InvalidParams, PublicFacts
from dpcore.preprocessing import RowTransform, scale_to_unit, standardise, unit_features

LO = np.array([0.0, -5.0, 100.0, 0.0])
HI = np.array([1.0, 5.0, 300.0, 1.0])


def test_rows_inside_the_bound_come_back_exact() -> None:
    transform = RowTransform.unit_range(LO, HI, 1.5)
    X = np.array([[0.2, 0.0, 150.0, 0.1], [0.0, -5.0, 100.0, 0.0]])  # scaled norms ≤ 1.5
    assert np.all(np.linalg.norm(scale_to_unit(X, LO, HI), axis=1) <= 1.5)
    np.testing.assert_allclose(transform.real_rows(X), X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(transform.to_raw(transform.rows(X)), X, rtol=1e-12, atol=1e-12)


def test_rows_outside_are_scaled_down_towards_the_lower_bounds() -> None:
    transform = RowTransform.unit_range(LO, HI, 1.0)
    x = np.array([[1.0, 5.0, 300.0, 1.0]])  # scaled: all ones, norm 2
    out = transform.real_rows(x)
    np.testing.assert_allclose(out, [LO + 0.5 * (HI - LO)])
    # Values past the declared bounds are clipped to them first.
    np.testing.assert_allclose(transform.real_rows(np.array([[9.0, 9.0, 900.0, 9.0]])), out)


def test_c_of_one_is_the_old_per_row_normalisation() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(LO, HI, size=(50, 4))
    np.testing.assert_array_equal(
        RowTransform.unit_range(LO, HI, 1.0).rows(X), unit_features(X, LO, HI)
    )


@settings(max_examples=200, deadline=None)
@given(
    raw=hnp.arrays(np.float64, (2, 4), elements=st.floats(-1e3, 1e3)),
    clip=st.floats(0.05, 2.0),
)
def test_the_divided_rows_keep_the_unit_sensitivity_whatever_c(
    raw: np.ndarray, clip: float
) -> None:
    """What every unit-scale accountant assumes (dpmix's √2 per record): rows of norm ≤ 1
    with no negative value, for any C and any raw records."""
    rows = RowTransform.unit_range(LO, HI, clip).rows(raw)
    assert np.all(rows >= 0)
    assert np.all(np.linalg.norm(rows, axis=1) <= 1 + 1e-12)
    assert np.linalg.norm(rows[0] - rows[1]) <= FEATURE_SENSITIVITY + 1e-12


def test_worst_case_neighbours_attain_the_sensitivity_at_any_c() -> None:
    """Disjoint supports at norm ≥ C: √2 apart after the transform — the bound is tight, so
    the accountant is not loose about the transform either."""
    for clip in (0.5, 1.0, 1.4):  # ≤ √2, the norm of each record below
        a = np.array([[1.0, 5.0, 100.0, 0.0]])
        b = np.array([[0.0, -5.0, 300.0, 1.0]])
        transform = RowTransform.unit_range(LO, HI, clip)
        distance = np.linalg.norm(transform.rows(a) - transform.rows(b))
        assert distance == pytest.approx(math.sqrt(2), rel=1e-12)


def test_dpcda_modes_match_their_accounted_geometry() -> None:
    """DP-CDA takes C as an accountant key (rows not divided): unit_range rows ≤ √2·C apart,
    declared standardisation the same map as standardise-then-clip."""
    rng = np.random.default_rng(1)
    X = rng.uniform(LO - 1, HI + 1, size=(200, 4))
    unit = RowTransform.unit_range(LO, HI, 0.8, divide=False).rows(X)
    assert np.linalg.norm(unit, axis=1).max() <= 0.8 * (1 + 1e-12)
    gaps = np.linalg.norm(unit[:, None, :] - unit[None, :, :], axis=2)
    assert gaps.max() <= record_distance(clip_norm=0.8, nonnegative=True) + 1e-12
    mean, std = (LO + HI) / 2, (HI - LO) / 4
    declared = RowTransform(LO, HI, mean, std, 2.0)
    old = standardise(np.clip(X, LO, HI), mean, std)
    old = old / np.maximum(np.linalg.norm(old, axis=1, keepdims=True) / 2.0, 1.0)
    np.testing.assert_allclose(declared.rows(X), old, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        declared.to_raw(declared.rows(X)), mean + std * old, rtol=1e-12, atol=1e-12
    )


def test_centred_combinations_are_scaled_not_shifted() -> None:
    transform = RowTransform.unit_range(LO, HI, 2.0, output="centred")
    v = np.array([[0.5, 0.5, 0.5, 0.5]])
    np.testing.assert_allclose(transform.to_raw(v), 2.0 * 0.5 * (HI - LO)[None, :])
    x = np.array([[0.5, 0.0, 200.0, 0.5]])  # scaled norm 1 ≤ 2: comparable as x − lo
    np.testing.assert_allclose(transform.real_rows(x), x - LO)


def test_mechanism_output_is_left_as_made() -> None:
    transform = RowTransform.unit_range(LO, HI, 1.0, output="mechanism")
    v = np.array([[0.1, -0.2]])
    np.testing.assert_array_equal(transform.to_raw(v), v)


def test_metadata_round_trip_and_float32() -> None:
    transform = RowTransform.unit_range(LO, HI, 1.25)
    again = RowTransform.from_metadata(transform.to_metadata())
    X = np.random.default_rng(2).uniform(LO, HI, size=(10, 4))
    np.testing.assert_array_equal(again.rows(X), transform.rows(X))
    values = transform.rows(X).astype(np.float32)
    assert transform.to_raw(values).dtype == np.float32


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_refuses_a_bad_clip_norm(bad: float) -> None:
    with pytest.raises(ValueError):
        RowTransform.unit_range(LO, HI, bad)


def test_default_rule_and_the_sqrt_d_cap() -> None:
    table = PublicFacts(n=100, n_features=30, n_classes=2)
    image = PublicFacts(n=100, n_features=784, n_classes=10, feature_shape=(28, 28))
    assert default_clip_norm(table) == math.ceil(math.sqrt(30)) / 2
    assert default_clip_norm(image) == 28 / 3
    assert default_clip_norm(PublicFacts(n=100, n_features=2, n_classes=2)) == 1.0
    check_clip_norm(math.sqrt(30), table)
    with pytest.raises(InvalidParams, match="exceeds √d"):
        check_clip_norm(math.sqrt(30) * 1.01, table)


@pytest.mark.parametrize(
    "name", ["dpmix", "dpcda", "sgdrm", "clustmix", "local_perturbation", "random_projection"]
)
def test_every_row_clipping_mechanism_resolves_the_shape_default(name: str) -> None:
    spec = registry.get(name)
    facts = PublicFacts(
        n=400, n_features=30, n_classes=2, max_release_rows=10**6, class_counts=(200, 200)
    )
    params = spec.resolve(spec.request_params.model_validate({}), facts)
    assert params.clip_norm == default_clip_norm(facts)  # type: ignore[attr-defined]
    spec.check(params, facts)


def test_blocks_on_threads_give_the_values_of_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rows``, ``to_raw`` and ``float64_rows`` over blocks of rows on several threads: the
    same values as on one thread, block for block (several blocks, the last one partial)."""
    rng = np.random.default_rng(4)
    X = rng.integers(0, 256, size=(20_011, 50), dtype=np.uint8)
    t = RowTransform.unit_range(np.zeros(50), np.full(50, 200.0), 3.0)
    results = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        rows = t.rows(X, np.float32)
        results[threads] = (rows, t.to_raw(rows), preprocessing.float64_rows(X))
    for one, several in zip(results["1"], results["3"], strict=True):
        assert one.dtype == several.dtype
        np.testing.assert_array_equal(one, several)
    np.testing.assert_array_equal(results["3"][2], X.astype(np.float64))


@pytest.mark.parametrize(("configured", "most"), [("1", 1), ("2", 2), ("", 4), ("x", 4)])
def test_block_threads_follow_the_operators_budget(
    monkeypatch: pytest.MonkeyPatch, configured: str, most: int
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", configured)
    usable = len(os.sched_getaffinity(0))
    assert preprocessing._threads() == max(1, min(most, usable))
