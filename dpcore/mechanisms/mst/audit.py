"""MST's audit: its first step, the noisy one-way histograms (``dpcore.marginals.audit``),
claimed against the ``tight`` accountant of the whole release (the selection and the two-way
step, two thirds of the budget, are not run)."""

from __future__ import annotations

from dpcore.audit.case import AuditCase
from dpcore.marginals.audit import one_way_case
from dpcore.mechanisms.mst.params import MSTParams
from dpcore.mechanisms.mst.release import noisy_counts


def case() -> AuditCase:
    return one_way_case(noisy_counts, MSTParams().bins)
