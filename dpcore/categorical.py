"""Decoding declared categorical columns in a release (issue 15, item 1).

An upload's categorical column is one-hot encoded into one feature per declared category; a
released row holds a noisy mixture of such blocks. Reading each block as the mixture's
category proportions (negative parts set to 0, then scaled to sum to 1) is post-processing
of the release: it reads nothing but the released values, so it costs no privacy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DECODING = (
    "each categorical column's one-hot features '<column>=<category>' hold the row's category "
    "proportions: the released block with negative values set to 0, scaled to sum to 1 "
    "(uniform where nothing positive is left); post-processing of the release. Sampling one "
    "category per row from these proportions is further post-processing a reader may do"
)


def category_proportions(X: np.ndarray, blocks: Sequence[Sequence[int]]) -> np.ndarray:
    """``X`` with each block of columns replaced by its proportions (a copy; float32 stays
    float32). Positive scaling of a row (unit scaling, L2 row clipping) leaves them as they
    were, so the one-hot blocks decode alike whatever the mechanism scaled rows by."""
    out = np.array(X, copy=True)
    for block in blocks:
        idx = list(block)
        part = np.clip(out[:, idx], 0.0, None)
        total = part.sum(axis=1, keepdims=True)
        uniform = np.full_like(part, 1.0 / len(idx))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, idx] = np.where(total > 0, part / np.where(total > 0, total, 1.0), uniform)
    return out
