"""AIM's audit: its first step, the noisy one-way histograms at σ₀ (``dpcore.marginals.audit``),
claimed against the ``tight`` accountant of the whole release at the default rounds (the rounds
after it, most of the budget, are not run)."""

from __future__ import annotations

from dpcore.audit.case import N_FEATURES, AuditCase
from dpcore.marginals.audit import one_way_case
from dpcore.mechanisms.aim.params import AIMParams, default_rounds
from dpcore.mechanisms.aim.release import noisy_counts


def case() -> AuditCase:
    return one_way_case(noisy_counts, AIMParams().bins, {"rounds": default_rounds(N_FEATURES + 1)})
