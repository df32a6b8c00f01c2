"""Preprocessing that uses only public, owner-declared facts (bounds and the label set).

``RowTransform`` is the one map between a dataset's raw units and the rows a mechanism reads:
clip every value to its declared [lo, hi], shift and scale per feature (the declared bounds, or
public standardisation statistics), then clip each row to L2 norm C — rows inside C are kept
exact — and, for the mechanisms whose accountants assume records of norm ≤ 1, divide by C.
Every step is a public function of the record alone, so the accountants' premises (norm bounds,
signs) hold whatever C is, and mapping the released rows back to raw units (``to_raw``) is
post-processing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np


def scale_to_unit(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Map every feature from its declared [lo, hi] to [0, 1] (values are clipped first)."""
    X = np.clip(np.asarray(X, dtype=np.float64), lo, hi)
    return (X - lo) / (hi - lo)


def clip_rows_l2(X: np.ndarray, max_norm: float = 1.0) -> np.ndarray:
    """Scale each row down to L2 norm ≤ max_norm; rows already inside are unchanged."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.maximum(norms / max_norm, 1.0)


def unit_features(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Unit-scale features: [0, 1] per feature, then each row scaled to L2 norm ≤ 1. Two such
    rows differ by at most √2 (their inner product is ≥ 0). ``RowTransform.unit`` with C = 1."""
    return clip_rows_l2(scale_to_unit(X, lo, hi))


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    out = np.zeros((labels.shape[0], n_classes), dtype=np.float64)
    out[np.arange(labels.shape[0]), labels] = 1.0
    return out


def standardise(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x − mean)/std with owner-declared (public) statistics."""
    if np.any(np.asarray(std) <= 0):
        raise ValueError("declared standard deviations must be > 0")
    return (np.asarray(X, dtype=np.float64) - mean) / std


# How a release's values relate to the dataset's raw units (``RowTransform.output``):
# ``raw`` — records or means of records, mapped back (shift + scale · value);
# ``centred`` — linear combinations of records (SGDRM): scaled back, not shifted, so a value is
#   a combination of (x − shift) and a real row compares as its clipped x − shift;
# ``mechanism`` — not in the dataset's feature space (a projection): left as the mechanism
#   made them.
OUTPUTS = ("raw", "centred", "mechanism")

# Values per block of ``RowTransform.rows`` (float64: 2 MiB, a block's temporaries stay in
# cache).
_BLOCK_VALUES = 1 << 18


def type_within(dtype: np.dtype[Any], lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether every value of the integer type ``dtype`` lies in [lo, hi] (bytes in [0, 255]):
    such values need no clipping to those bounds. False for any other type."""
    if not np.issubdtype(dtype, np.integer):
        return False
    kind = np.iinfo(dtype)
    return bool(np.all(np.asarray(lo) <= kind.min) and np.all(np.asarray(hi) >= kind.max))


def _threads() -> int:
    """Threads for ``_in_blocks``: the CPUs this process may run on, no more than
    ``OMP_NUM_THREADS`` where the operator set it (a worker's per-process thread budget, which
    torch follows too), and at most four (the per-block loops are bound by memory and cache
    beyond that)."""
    usable = len(
        os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    )
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    budget = int(configured) if configured.isdigit() and int(configured) > 0 else usable
    return max(1, min(4, usable, budget))


def _in_blocks(
    X: np.ndarray, dtype: Any, per_block: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """``per_block`` (a per-row map) over blocks of ``X``'s rows, each result rounded
    once into a ``dtype`` output: the values of the whole array at once. Blocks run on a few
    threads (numpy's loops release the GIL; each thread writes its own rows of the output),
    so the values do not depend on the thread count."""
    out = np.empty(X.shape, dtype=dtype)
    step = max(1, _BLOCK_VALUES // max(1, X.shape[1]))
    starts = range(0, len(X), step)

    def fill(start: int) -> None:
        out[start : start + step] = per_block(X[start : start + step])

    threads = min(_threads(), len(starts))
    if threads <= 1:
        for start in starts:
            fill(start)
        return out
    with ThreadPoolExecutor(threads, thread_name_prefix="rows") as pool:
        list(pool.map(fill, starts))  # re-raises a block's exception here
    return out


def float64_rows(X: np.ndarray) -> np.ndarray:
    """A float64 copy of ``X`` as rows × flat features, converted a block of rows at a time on
    a few threads (``_in_blocks``): a large array's fresh pages are first touched by several
    cores instead of one."""
    X = np.asarray(X)
    return _in_blocks(X.reshape(len(X), -1), np.float64, np.asarray)


@dataclass(frozen=True)
class RowTransform:
    """z = clip_C((clip(x, lo, hi) − shift) / scale) — the row a mechanism reads is z / divisor —
    and back: raw = shift + scale · divisor · value. ``clip_norm`` None: rows are not clipped
    (the mechanism bounds a record's influence otherwise, e.g. DP-SGD's gradient clip).

    ``divisor`` is C for the mechanisms whose accountants assume ‖row‖ ≤ 1 (their noise, in
    raw units, then scales with C), 1 for those that take C as an accountant key (DP-CDA)."""

    lo: np.ndarray
    hi: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    clip_norm: float | None
    divisor: float = 1.0
    output: str = "raw"

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"unknown transform output {self.output!r}")
        if self.clip_norm is not None and not (
            self.clip_norm > 0 and math.isfinite(self.clip_norm)
        ):
            raise ValueError("clip_norm must be a positive finite number")
        if np.any(np.asarray(self.scale) <= 0):
            raise ValueError("a transform's scales must be > 0")

    @classmethod
    def unit_range(
        cls,
        lo: np.ndarray,
        hi: np.ndarray,
        clip_norm: float | None,
        *,
        divide: bool = True,
        output: str = "raw",
    ) -> RowTransform:
        """Features scaled to [0, 1] by their declared bounds, rows clipped to C (and divided
        by C when ``divide``: rows of norm ≤ 1 for the unit-scale accountants)."""
        lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
        divisor = float(clip_norm) if divide and clip_norm is not None else 1.0
        return cls(lo, hi, lo, hi - lo, clip_norm, divisor, output)

    def clipped(self, X: np.ndarray) -> np.ndarray:
        """z: the scaled rows, clipped to norm ≤ C (not divided)."""
        X = np.clip(np.asarray(X, dtype=np.float64).reshape(len(X), -1), self.lo, self.hi)
        Z = (X - self.shift) / self.scale
        return Z if self.clip_norm is None else clip_rows_l2(Z, self.clip_norm)

    def rows(self, X: np.ndarray, dtype: type[np.floating[Any]] = np.float64) -> np.ndarray:
        """What the mechanism reads: z / divisor (‖·‖ ≤ 1 when divisor = C), as ``dtype``.

        Computed in float64 over blocks of rows, each block rounded once into the ``dtype``
        output: the same values as the whole array at once (every step is per value or per
        row), without whole-array float64 temporaries (a 60 000 × 784 upload's would be
        five passes over 376 MB)."""
        X = np.asarray(X)
        return _in_blocks(X.reshape(len(X), -1), dtype, self._rows64)

    def _rows64(self, X: np.ndarray) -> np.ndarray:
        if self.clip_norm is not None and self.divisor == self.clip_norm:
            # One division, as ``clip_rows_l2`` at norm 1 does: rows of norm ≤ C become x/C,
            # longer ones x/‖x‖, so no row's computed norm passes 1 by more than rounding.
            Z = self._within_bounds(X)
            Z -= self.shift
            Z /= self.scale
            Z /= np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), self.clip_norm)
            return Z
        return self.clipped(X) / self.divisor

    def _within_bounds(self, X: np.ndarray) -> np.ndarray:
        """X as float64 (a fresh array), clipped to [lo, hi]: np.clip's values, in place.
        Integers whose type cannot leave the bounds (bytes in [0, 255]) need no clipping."""
        Z = np.array(X, dtype=np.float64)
        if type_within(X.dtype, self.lo, self.hi):
            return Z
        np.maximum(Z, self.lo, out=Z)
        np.minimum(Z, self.hi, out=Z)
        return Z

    def to_raw(self, values: np.ndarray) -> np.ndarray:
        """Released values (the mechanism's scale) in raw units, per ``output``; a copy."""
        factor = (self.scale * self.divisor).astype(np.float64)
        if self.output == "mechanism":
            return np.array(values, copy=True)
        values = np.asarray(values)
        if values.ndim != 2:
            return self._to_raw64(values, factor).astype(values.dtype, copy=False)
        # In float64 over blocks of rows (as ``rows``): the same values, cache-sized temporaries.
        return _in_blocks(values, values.dtype, lambda block: self._to_raw64(block, factor))

    def _to_raw64(self, values: np.ndarray, factor: np.ndarray) -> np.ndarray:
        out = np.array(values, dtype=np.float64)
        out *= factor
        if self.output == "raw":
            out += self.shift
        return out

    def real_rows(self, X: np.ndarray) -> np.ndarray:
        """A real record as the release represents it (to test models on): clipped to the
        bounds and to C, in the release's units. Identity for rows within both."""
        return self.to_raw(self.rows(X))

    def to_metadata(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "shift": self.shift.tolist(),
            "scale": self.scale.tolist(),
            "clip_norm": self.clip_norm,
            "divisor": self.divisor,
            "lo": self.lo.tolist(),
            "hi": self.hi.tolist(),
        }

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> RowTransform:
        return cls(
            np.asarray(meta["lo"], dtype=np.float64),
            np.asarray(meta["hi"], dtype=np.float64),
            np.asarray(meta["shift"], dtype=np.float64),
            np.asarray(meta["scale"], dtype=np.float64),
            None if meta.get("clip_norm") is None else float(meta["clip_norm"]),
            float(meta.get("divisor", 1.0)),
            str(meta.get("output", "raw")),
        )


TRANSFORM_HELP = {
    "raw": "released features are in the dataset's raw units: value = shift + scale · v for "
    "the mechanism's value v (per feature, listed here). Each record was clipped to the "
    "declared [lo, hi], mapped to z = (x − shift)/scale, and scaled down to L2 norm clip_norm "
    "when ‖z‖ exceeded it (records inside are exact); compare real records through the same "
    "clipping (dprelease evaluate does)",
    "centred": "released features are signed combinations of records, in the raw units' "
    "scale but not shifted: value = scale · v, a combination of (x − shift); a real record "
    "compares as its clipped x − shift",
    "mechanism": "released features are not in the dataset's feature space (see the "
    "mechanism's arrays); a real record maps through the same clipping, then the mechanism's "
    "public map",
}
