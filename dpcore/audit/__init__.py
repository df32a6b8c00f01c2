"""Empirical privacy audits: lower bounds on ε from running the real mechanisms."""

from dpcore.audit import stats
from dpcore.audit.harness import parse_params, releases, run_audit

__all__ = ["parse_params", "releases", "run_audit", "stats"]
