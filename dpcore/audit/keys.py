"""Audit keys most mechanisms share (light: a spec imports them without numpy or torch)."""

from __future__ import annotations

from dpcore.accounting.accountant import Key

# The audit's defaults are the smallest releases that give a bound close to the claim (no
# subsampling where the mechanism allows, a few rows); see docs/privacy.md, "Empirical audits".
N = Key("n", int, "records in D and D′ (public)", required=False, default=2)
NOISE_RATIO = Key(
    "noise_ratio", float, "σ_y/σ_x (labels' noise over features')", required=False, default=1.0
)
