"""Admission's bounds agree with what the job refuses: whatever ``check_drawable`` admits, the
secure sampler plans for every call it covers; ``check_rbf_width`` admits what the k-means
sampler covers for the frequencies drawn."""

from __future__ import annotations

import math

import pytest
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.kmeans import SUM_ROW_UNIT, FourierFeatures, check_rbf_width
from dpcore.mechanisms.noise import MIN_UNIT_SHARE, check_drawable, lattice_plan
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import InvalidParams


@pytest.mark.parametrize("width", [1, 50, 10**6, 4 * 10**9])
def test_what_check_drawable_admits_the_sampler_draws(width: int) -> None:
    sensitivity = 2.0
    admitted = refused = 0
    for exponent in range(0, 16):
        sigma = 10.0**exponent
        try:
            check_drawable(sigma=sigma, sensitivity=sensitivity, width=width)
        except ValueError:
            refused += 1
            continue
        admitted += 1
        # Every call of that scale: narrower rows, units down to the smallest share of the
        # sensitivity, a rounding error almost the unit.
        for dim in (1, max(1, width // 7), width):
            for unit in (sensitivity * MIN_UNIT_SHARE, sensitivity):
                lattice_plan(
                    sigma=sigma, sensitivity=sensitivity, dim=dim, error=0.999 * unit, unit=unit
                )
    assert admitted and refused  # the bound sits inside the grid


def test_check_rbf_width_admits_what_the_kmeans_covers() -> None:
    k, frequencies, n = 784, 200, 10_000
    with pytest.raises(InvalidParams, match="rbf_width"):
        check_rbf_width(k=k, frequencies=frequencies, width=1e-7, terms=n, input_error=2.0**-23)
    width = 1e-3
    check_rbf_width(k=k, frequencies=frequencies, width=width, terms=n, input_error=2.0**-23)
    features = FourierFeatures.draw(k, frequencies, width, SecureRandom())
    error = features.sum_error(float_error.stored_rows(1.0), terms=n)
    assert math.isfinite(error) and error < SUM_ROW_UNIT
    assert features.frequencies.dtype == torch.float64
