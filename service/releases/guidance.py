"""The preview's guidance: the signal-to-noise in raw units — the noise a release
puts on each released feature value, mapped back through the public preprocessing to the
column's declared range — and the recommended configuration of every served mechanism
(``recommended``, from ``dpcore.mechanisms.recommend``'s measured table).

Only public figures enter: the calibrated σ (what the preview reports in ``noise``), the
declared feature bounds, the declared shape and the mechanism's public basis. The
preprocessing scales each column to [0, 1] by its declared [lo, hi] and then scales rows down
to the norm bound; the mechanism adds noise of std ``unit_std[p]`` to every released value of
feature p on that scale (``dpcore.mechanisms.spec.FeatureNoise``). A value's noise in raw units
is therefore ``unit_std[p] × (hi − lo)`` for a record the norm bound left unscaled, and up to
``max_shrink`` times that for one it scaled down (how much depends on the record: private, so
only the public bound is given)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from dpcore.accounting.events import NoiseDescription
from dpcore.mechanisms import recommend, registry
from dpcore.mechanisms.spec import MechanismSpec, PublicFacts
from service.datasets.schemas import MissingIndicator, NumericColumn, declared_columns
from service.models import Dataset
from service.releases.schemas import (
    ColumnNoise,
    MeasuredOn,
    NoiseGuide,
    NoiseSpread,
    Recommendation,
)


@dataclass(frozen=True)
class _Columns:
    """Every feature column's declared [lo, hi] and feature position (-1: unknown), as
    arrays, and its name on demand: a preview of a dataset of millions of features builds no
    Python object per feature."""

    lo: np.ndarray
    hi: np.ndarray
    position: np.ndarray
    names: Sequence[str] | None  # None: a column is named by its position

    def name(self, i: int) -> str:
        return str(i) if self.names is None else self.names[i]


def _columns(dataset: Dataset) -> _Columns:
    """Every feature column. A single declared range names columns by position (NPZ's flat
    index; a CSV's or Parquet's file order); a per-column range names them, with their
    positions known for NPZ only (its names are the flat indices); declared columns encode
    to features in declaration order, one-hot and indicator features in [0, 1]."""
    declared: Any = dataset.feature_range
    columns = declared_columns(declared)
    if columns is not None:
        encoded: list[tuple[str, float, float]] = []
        for column in columns:
            if isinstance(column, NumericColumn):
                lo, hi = column.bounds
                encoded.append((column.name, float(lo), float(hi)))
            else:
                encoded.extend((f"{column.name}={c}", 0.0, 1.0) for c in column.categories)
            if isinstance(column.missing, MissingIndicator):
                encoded.append((f"{column.name}_missing", 0.0, 1.0))
        return _Columns(
            np.array([e[1] for e in encoded]),
            np.array([e[2] for e in encoded]),
            np.arange(len(encoded)),
            [e[0] for e in encoded],
        )
    if isinstance(declared, Mapping):
        names = [str(name) for name in declared]
        npz = dataset.format == "npz"
        return _Columns(
            np.array([float(lo) for lo, _ in declared.values()]),
            np.array([float(hi) for _, hi in declared.values()]),
            np.array([int(n) if npz and n.isdigit() else -1 for n in names], dtype=np.int64),
            names,
        )
    d = dataset.n_features
    return _Columns(
        np.full(d, float(declared[0])),
        np.full(d, float(declared[1])),
        np.arange(d),
        None,
    )


def _spread(values: np.ndarray) -> NoiseSpread:
    return NoiseSpread(
        min=float(np.min(values)), median=float(np.median(values)), max=float(np.max(values))
    )


#: Columns a mostly-noise warning names.
MOSTLY_NOISE_NAMED = 10


def noise_guide(
    spec: MechanismSpec,
    params: Mapping[str, Any],
    facts: PublicFacts,
    noise: NoiseDescription,
    dataset: Dataset,
    max_columns: int,
) -> NoiseGuide:
    if spec.guidance.feature_noise is None:
        return NoiseGuide(
            applies=False,
            meaning=f"{spec.name} declares no per-value noise on its released features",
            max_row_shrink=None,
            noise_to_range=None,
            noise_std_raw=None,
            columns=None,
        )
    feature = spec.guidance.feature_noise(spec.params.model_validate(dict(params)), facts, noise)
    if feature.unit_std is None:
        return NoiseGuide(
            applies=False,
            meaning=feature.meaning,
            max_row_shrink=None,
            noise_to_range=None,
            noise_std_raw=None,
            columns=None,
        )
    unit = np.asarray(feature.unit_std, dtype=np.float64)
    cols = _columns(dataset)
    # A column whose position is unknown (a per-column range on a CSV or Parquet file) gets
    # the root mean square over positions: exact when the noise is the same everywhere (no
    # basis, the usual case on tables), an average with a basis.
    rms = float(np.sqrt(np.mean(np.square(unit)))) if unit.size else 0.0
    known = (cols.position >= 0) & (cols.position < unit.size)
    to_range = np.where(known, unit[np.where(known, cols.position, 0)] if unit.size else 0, rms)
    std_raw = to_range * (cols.hi - cols.lo)
    listed = None
    if len(to_range) <= max_columns:
        listed = [
            ColumnNoise(
                column=cols.name(i),
                range=(float(cols.lo[i]), float(cols.hi[i])),
                noise_std_raw=float(std_raw[i]),
                noise_to_range=float(to_range[i]),
            )
            for i in range(len(to_range))
        ]
    noisy = np.flatnonzero(to_range >= 1.0)
    return NoiseGuide(
        mostly_noise=[cols.name(int(i)) for i in noisy[:MOSTLY_NOISE_NAMED]],
        mostly_noise_count=int(noisy.size),
        applies=True,
        meaning=f"{feature.meaning}; the figures are that noise's std in each column's raw "
        "units (unit-scale std × (hi − lo)) for a record the row-norm bound left unscaled, "
        f"up to {feature.max_shrink:.4g} times larger for one it scaled down",
        max_row_shrink=feature.max_shrink,
        noise_to_range=_spread(to_range),
        noise_std_raw=_spread(std_raw),
        columns=listed,
    )


def noise_warnings(guide: NoiseGuide, n_columns: int) -> list[dict[str, str]]:
    """A plain warning where some columns' values would be mostly noise."""
    if not guide.mostly_noise_count:
        return []
    count = guide.mostly_noise_count
    named = ", ".join(guide.mostly_noise or ())
    more = (
        f", and {count - len(guide.mostly_noise or ())} more" if count > MOSTLY_NOISE_NAMED else ""
    )
    which = "every column" if count == n_columns else f"{count} of {n_columns} columns"
    return [
        {
            "code": "mostly_noise",
            "message": f"values in {which} ({named}{more}) will be mostly noise at this ε: "
            "the noise added to each value has a larger std than the column's declared "
            "range. A larger ε, tighter declared bounds, or a mechanism that releases "
            "records from a fitted model keeps more of them",
        }
    ]


def recommendations(facts: PublicFacts, epsilon: float, delta: float) -> list[Recommendation]:
    """Every served mechanism's recommended configuration for a dataset of these public facts
    at ``epsilon`` (and ``delta``, for checks that need the target). The class counts are
    private: dropped here, before the lookup sees the facts (which puts a balanced stand-in
    in their place for the admission checks)."""
    public = replace(facts, class_counts=None)
    out = []
    for r in recommend.recommend_all(registry.served(), public, epsilon, delta=delta):
        measured = None
        if r.measured is not None:
            fields = asdict(r.measured)
            del fields["mechanism"], fields["params"]
            measured = MeasuredOn(**fields)
        out.append(
            Recommendation(
                mechanism=r.mechanism,
                kind=r.kind,  # type: ignore[arg-type]
                params=r.params,
                resolved_params=r.resolved,
                measured_on=measured,
                distance=r.distance,
                same_kind=r.kind_matches,
                why=r.why,
            )
        )
    return out


def mechanism_warnings(
    spec: MechanismSpec, params: Mapping[str, Any], facts: PublicFacts, noise: NoiseDescription
) -> list[dict[str, str]]:
    """The mechanism's own warnings for this request (``Guidance.warnings``): public facts
    and the noise as charged only."""
    if spec.guidance.warnings is None:
        return []
    return spec.guidance.warnings(spec.params.model_validate(dict(params)), facts, noise)


def shape_warnings(dataset: Dataset) -> list[dict[str, str]]:
    """A hint for flat, all-numeric rows that could be square images: image-shaped data gets
    other defaults (a 2-D DCT basis, image clip norms), which only a declared shape selects."""
    shape = list(dataset.feature_shape)
    d = shape[0] if len(shape) == 1 else 0
    side = math.isqrt(d)
    if d < 64 or side * side != d or declared_columns(dataset.feature_range) is not None:
        return []
    return [
        {
            "code": "shape_undeclared",
            "message": f"these {d} features are one flat axis: if each row is a {side}×{side} "
            f"image, upload it with metadata feature_shape [{side}, {side}] (row-major) to get "
            "the image defaults (2-D DCT basis, image clip norm), as an NPZ array of that "
            "shape would",
        }
    ]
