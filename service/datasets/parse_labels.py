"""Labels and bounds of a parsed upload, and the wording its refusals share: label indexing
against the declared classes, per-feature bounds, and how positions and values are quoted."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from service.datasets.schemas import Range
from service.errors import InvalidInput

# Class names, not text: also keeps sorting the labels cheap.
MAX_LABEL_CHARS = 200

Label = int | str
Where = Callable[[int], str]  # 0-based position -> "in row 4" / "at y[3]"


def y_position(i: int) -> str:
    return f"at y[{i}]"


def row_position(i: int) -> str:
    return f"in row {i + 1}"


def long_label(length: int, where: str) -> str:
    return f"label {where} has {length} characters; labels have at most {MAX_LABEL_CHARS}"


# A parser's failure in our words: its own text names library internals and may quote the
# file's bytes, so a 422 never carries it (nor does the log: the bytes are the owner's data).
_RAGGED = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
_UNREADABLE = {
    "csv": "it is not UTF-8 text of comma-separated rows under one header line",
    "parquet": "it is not a readable Parquet file (damaged, truncated, or an encoding this "
    "server does not read)",
    "npz": "it is not a readable NPZ archive of .npy arrays (damaged or truncated)",
}


def unreadable(fmt: str, exc: BaseException) -> InvalidInput:
    """The 422 of a file its parser could not read: why, in the service's own words."""
    ragged = _RAGGED.search(str(exc)) if fmt == "csv" else None
    if ragged is not None:
        expected, line, saw = ragged.groups()
        reason = f"line {line} of the file has {saw} fields where the header has {expected}"
    elif isinstance(exc, UnicodeDecodeError):
        reason = "it is not UTF-8 text"
    elif isinstance(exc, zipfile.BadZipFile):
        reason = "it is not a zip archive (an NPZ file is one)"
    else:
        reason = _UNREADABLE.get(fmt, f"it is not a readable {fmt} file")
    return InvalidInput(f"file could not be read as {fmt}: {reason}")


def whole(values: np.ndarray, where: Where) -> np.ndarray:
    """Float labels as int64, provided every one is a whole number."""
    with np.errstate(over="ignore"):  # 2**63 is inf in float16: still a fair comparison
        bad = ~np.isfinite(values) | (np.abs(values) >= 2.0**63)
    bad[~bad] = values[~bad] != np.round(values[~bad])
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"label {values[i].item()!r} {where(i)} is not a whole number; "
            "labels must be integers or strings"
        )
    return values.astype(np.int64)


def index_labels(
    raw: np.ndarray, declared: Sequence[Label] | None, where: Where, as_text: bool
) -> tuple[np.ndarray, list[Label]]:
    uniques, inverse = np.unique(raw, return_inverse=True)
    present: list[Label] = uniques.tolist()  # numpy scalars -> Python int / str
    if declared is None:
        if len(present) < 2:
            raise InvalidInput(
                f"found only one class ({present[0]!r}) among the labels; declare `classes` "
                "to list every class, including those absent from this file"
            )
        return inverse.reshape(-1).astype(np.int64), present

    position = {str(c) if as_text else c: k for k, c in enumerate(declared)}
    lookup = np.array([position.get(u, -1) for u in present], dtype=np.int64)
    labels = lookup[inverse.reshape(-1)]
    unknown = labels < 0
    if unknown.any():
        i = int(np.argmax(unknown))
        label = raw[i].item() if isinstance(raw[i], np.generic) else raw[i]
        hint = ""
        if not as_text and not any(type(c) is type(label) for c in declared):
            kinds = "strings" if isinstance(label, str) else "integers"
            hint = f" (labels in this file are {kinds}; 3 and '3' are different classes)"
        raise InvalidInput(
            f"label {label!r} {where(i)} is not among the declared classes "
            f"{some(list(declared))}{hint}"
        )
    return labels, list(declared)


def feature_bounds(
    feature_range: Range | Mapping[str, Range], names: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(feature_range, Mapping):
        lo, hi = feature_range
        return np.full(len(names), lo, dtype=np.float64), np.full(len(names), hi, dtype=np.float64)
    known = set(names)
    missing = [n for n in names if n not in feature_range]
    unknown = [k for k in feature_range if k not in known]
    refuse_mismatch(
        "feature_range must give [lo, hi] for every feature and nothing else",
        (f"no range for {len(missing)} feature(s)", missing),
        (f"{len(unknown)} name(s) that are not features", unknown),
    )
    pairs = np.array([feature_range[n] for n in names], dtype=np.float64)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def refuse_mismatch(rule: str, *parts: tuple[str, Sequence[Any]]) -> None:
    """422 stating ``rule`` and each non-empty list of names that breaks it."""
    problems = [f"{what}: {some(names)}" for what, names in parts if names]
    if problems:
        raise InvalidInput(f"{rule}; " + "; ".join(problems))


def some(items: Sequence[Any], limit: int = 10) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    more = f", … ({len(items)} in all)" if len(items) > limit else ""
    return f"[{shown}{more}]"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
