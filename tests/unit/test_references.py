"""The references of bench/references.py: DP-SGD's noise calibration never over-spends, the
zCDP → (ε, δ) conversion is valid, and the MST synthesizer reproduces a tree-structured
distribution when its noise is negligible."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from bench import references as ref
from bench.mnist import DELTA


def test_dpsgd_noise_is_the_smallest_within_the_target() -> None:
    n, batch, steps = 10000, 256, 200
    z = ref.calibrate_z(1.0, n, batch, steps, DELTA)
    assert ref.dpsgd_epsilon(z, n, batch, steps, DELTA) <= 1.0
    # A little less noise would pass the target: the calibration does not waste budget.
    assert ref.dpsgd_epsilon(z * (1 - 2e-3), n, batch, steps, DELTA) > 1.0


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_zcdp_conversion_meets_delta_and_matches_the_gaussian(epsilon: float) -> None:
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    rho = ref.cdp_rho(epsilon, DELTA)
    assert ref.cdp_delta(rho, epsilon) <= DELTA
    # A Gaussian with noise multiplier z is exactly 1/(2z²)-zCDP: its RDP accountant's ε at δ
    # must agree with the conversion (both are the same Rényi bound, RDP on a grid of orders).
    accountant = RdpAccountant()
    accountant.compose(dpa.GaussianDpEvent(1 / math.sqrt(2 * rho)))
    assert accountant.get_epsilon(DELTA) == pytest.approx(epsilon, rel=0.02)


def test_coarsen_and_upsample() -> None:
    images = np.zeros((2, 28, 28))
    images[0, :4, :4] = 255.0  # one bright pooled cell
    images[1] = 100.0  # 100 → level 1 of 4 (bins of 64)
    levels = ref.coarsen(images.reshape(2, -1))
    assert levels.shape == (2, 49)
    assert levels[0, 0] == 3 and levels[0, 1:].max() == 0
    assert np.all(levels[1] == 1)
    back = ref.upsample(levels).reshape(2, 28, 28)
    assert back[0, 0, 0] == back[0, 3, 3] == 224.0 and back[0, 4, 4] == 32.0
    assert np.all(back[1] == 96.0)


def test_mst_reproduces_a_chain_with_negligible_noise() -> None:
    rng = np.random.default_rng(0)
    n, sizes = 20000, [3, 3, 3, 4]
    # A chain a0 → a1 → a2 → a3: each attribute copies its parent (mod size) 90% of the time.
    data = np.zeros((n, 4), dtype=np.int64)
    data[:, 0] = rng.integers(0, 3, n)
    for a in range(1, 4):
        copy = rng.random(n) < 0.9
        data[:, a] = np.where(copy, data[:, a - 1] % sizes[a], rng.integers(0, sizes[a], n))
    synthetic, _ = ref.mst(data, sizes, 1e6, np.random.default_rng(1))
    assert synthetic.shape == data.shape
    for a, b in [(0, 1), (1, 2), (2, 3), (0, 3)]:
        real = ref._marginal(data, sizes, (a, b)) / n
        made = ref._marginal(synthetic, sizes, (a, b)) / n
        assert 0.5 * np.abs(real - made).sum() < 0.03, (a, b)


def test_mst_at_small_epsilon_loses_the_dependence() -> None:
    # The same chain at ε = 0.05 on 2000 rows: the noise must be visible — a synthesizer that
    # ignored its budget would keep the 90% copy rate.
    rng = np.random.default_rng(0)
    n, sizes = 2000, [3, 3]
    data = np.zeros((n, 2), dtype=np.int64)
    data[:, 0] = rng.integers(0, 3, n)
    data[:, 1] = np.where(rng.random(n) < 0.9, data[:, 0], rng.integers(0, 3, n))
    copies = [
        np.mean(s[:, 0] == s[:, 1])
        for s in (ref.mst(data, sizes, 0.05, np.random.default_rng(k))[0] for k in range(5))
    ]
    assert np.mean(copies) < 0.8


def test_runs_at_other_epsilons_add_up(tmp_path: Path) -> None:
    path = tmp_path / "references.csv"
    first = [
        {"reference": r, "epsilon": e, "family": "mlp", "accuracy": 0.5, "seconds": 1, "notes": ""}
        for r in ("dpsgd", "mst")
        for e in (1.0, 10.0)
    ]
    ref.write_merged(path, first)
    again = [{**first[0], "accuracy": 0.7}]  # dpsgd at ε = 1 redone
    ref.write_merged(path, again)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["reference"], float(r["epsilon"]), r["accuracy"]) for r in rows] == [
        ("dpsgd", 1.0, "0.7"),
        ("mst", 1.0, "0.5"),
        ("dpsgd", 10.0, "0.5"),
        ("mst", 10.0, "0.5"),
    ]
