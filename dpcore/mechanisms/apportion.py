"""Released rows split over groups in proportion to their weights (shared by the mechanisms
that repeat what they fitted: ClustMix's cluster means, DPGM's per-cluster models)."""

from __future__ import annotations

import numpy as np


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` rows split in proportion to ``weights`` (> 0) by largest remainders
    (Hamilton's method); ties go to the earlier index."""
    share = weights / weights.sum() * total
    rows = np.floor(share).astype(np.int64)
    order = np.argsort(-(share - rows), kind="stable")
    rows[order[: total - int(rows.sum())]] += 1
    return rows
