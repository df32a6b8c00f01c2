"""Shared by mechanisms that release every record once, noised (the local-perturbation and
random-projection baselines of Lee et al., ISIT 2019, Section IV).

Records are unit-scale: features in [0, 1] with ‖x‖ ≤ 1, so two records differ by
‖x − x′‖ ≤ √2 (‖x − x′‖² = ‖x‖² + ‖x′‖² − 2⟨x, x′⟩ ≤ 2 as ⟨x, x′⟩ ≥ 0), and one-hot labels,
‖y − y′‖ ≤ √2. Neighbours are replace-one with n public; replacing a record changes only its
own released row.

The two sensitivities are those of any unit-scale record and one-hot label: DPMix's mixtures
(``dpcore.mechanisms.record_assignment``) divide them by ℓ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from dpcore.accounting.events import NoiseDescription, NoiseScale

FEATURE_SENSITIVITY = math.sqrt(2.0)  # ‖x − x′‖ of unit-scale records
LABEL_SENSITIVITY = math.sqrt(2.0)  # one-hot labels


def positive(name: str, value: Any) -> float:
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return out


def integer(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if out < low:
        raise ValueError(f"{name} must be >= {low}, got {out}")
    return out


def check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def row_noise(
    *, sigma_x: float, feature_sensitivity: float, sigma_y: float, features: str
) -> NoiseDescription:
    """Noise on each released row: its features (moved by at most ``feature_sensitivity``)
    and its one-hot label (√2)."""
    return NoiseDescription(
        scales=(
            NoiseScale("features", sigma_x, feature_sensitivity, ("features",), features),
            NoiseScale("labels", sigma_y, LABEL_SENSITIVITY, ("labels",), "each one-hot label"),
        ),
        calibrated="features",
    )


def gdp_guess(sensitivity_sq: float) -> Callable[[Mapping[str, Any], float, float], float]:
    """A calibration starting point: σ with √(sensitivity_sq)/σ the μ meeting (ε, δ),
    treating σ_y = ratio·σ."""

    def guess(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
        from dpcore.accounting import gdp

        ratio = keys["noise_ratio"] if keys["sigma_y"] is None else 1.0
        scale = keys.get("spectral_norm") or 1.0
        mu = gdp.mu_for_epsilon(epsilon, delta)
        return math.sqrt(sensitivity_sq * (scale**2 + 1 / ratio**2)) / mu

    return guess


GUESS_REPLACE_ONE = gdp_guess(2.0)
GUESS_UNIT_DIFFERENCE = gdp_guess(1.0)
