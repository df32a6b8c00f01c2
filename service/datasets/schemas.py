"""Request and response bodies of the datasets domain."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, field_validator, model_validator

from service.strict_json import FROM_JSON, JsonInt, StrictBody

ClassLabel = Annotated[JsonInt | str, Field(description="A class label as it appears in the file")]


class Budget(StrictBody):
    """A privacy budget (ε, δ) under replace-one neighbours."""

    epsilon: float = Field(gt=0, description="Total ε the dataset may spend; finite, > 0")
    delta: float = Field(gt=0, lt=1, description="δ at which every spend is measured; 0 < δ < 1")

    @field_validator("epsilon", "delta")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


# [lo, hi]: a JSON array (a tuple read from it), of JSON numbers only.
Range = Annotated[tuple[float, float], FROM_JSON]

# --- declared column schema (schema-aware uploads) -------------------------------------------
# Every fact below is the owner's public declaration; nothing is read from the data to build it.

Category = Annotated[JsonInt | str, Field(description="A category as it appears in the file")]
MAX_CATEGORY_CHARS = 200  # as labels: categories are names, not text


class MissingConstant(StrictBody):
    """Missing entries take a public constant: a number within the column's bounds, or one of
    its declared categories."""

    policy: Literal["constant"]
    value: float | str = Field(
        description="numeric columns: a number within bounds; categorical: a declared category"
    )


class MissingIndicator(StrictBody):
    """A public 0/1 feature ``<name>_missing`` marks missing entries, which take ``fill``."""

    policy: Literal["indicator"]
    fill: float | str | None = Field(
        default=None,
        description="What a missing entry takes. Numeric: a number within bounds (default: the "
        "bounds' midpoint); categorical: a declared category (default: none, an all-zero "
        "one-hot block)",
    )


Missing = Annotated[MissingConstant | MissingIndicator, Field(discriminator="policy")]


class NumericColumn(StrictBody):
    name: str = Field(min_length=1, max_length=200)
    type: Literal["numeric"]
    bounds: Range = Field(description="Public [lo, hi]; values outside are clipped and counted")
    integer: bool = Field(
        default=False,
        description="Whole numbers: the upload must hold whole numbers here, and released "
        "values are rounded to whole numbers within the bounds (post-processing); a release "
        "table types the column as integers",
    )
    missing: Missing | None = Field(
        default=None, description="Without a policy a missing value is refused (422)"
    )

    @model_validator(mode="after")
    def _valid(self) -> NumericColumn:
        lo, hi = self.bounds
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"column {self.name!r}: bounds must be finite numbers")
        if not lo < hi:
            raise ValueError(f"column {self.name!r}: bounds need lo < hi, got [{lo}, {hi}]")
        if self.integer and math.ceil(lo) > math.floor(hi):
            raise ValueError(
                f"column {self.name!r}: an integer column's bounds [{lo}, {hi}] must hold a "
                "whole number"
            )
        fill = _declared_fill(self.missing)
        if fill is not None and (
            isinstance(fill, str) or not (math.isfinite(fill) and lo <= fill <= hi)
        ):
            raise ValueError(
                f"column {self.name!r}: the missing-value fill must be a number within "
                f"its bounds [{lo}, {hi}]"
            )
        return self


class CategoricalColumn(StrictBody):
    name: str = Field(min_length=1, max_length=200)
    type: Literal["categorical"]
    categories: list[Category] = Field(
        description="The declared category set (public), every category including those absent "
        "from the file; matched by text (3 and '3' are the same category). One-hot encoded "
        "into features '<name>=<category>'"
    )
    missing: Missing | None = Field(
        default=None, description="Without a policy a missing value is refused (422)"
    )

    @model_validator(mode="after")
    def _valid(self) -> CategoricalColumn:
        if not self.categories:
            raise ValueError(f"column {self.name!r}: categories must list at least one category")
        texts = [str(c) for c in self.categories]
        if len(set(texts)) != len(texts):
            raise ValueError(f"column {self.name!r}: categories must be distinct (by their text)")
        if any(not t or len(t) > MAX_CATEGORY_CHARS for t in texts):
            raise ValueError(
                f"column {self.name!r}: categories need 1 to {MAX_CATEGORY_CHARS} characters"
            )
        fill = _declared_fill(self.missing)
        if fill is not None and _category_text(fill) not in texts:
            raise ValueError(
                f"column {self.name!r}: the missing-value fill must be one of its declared "
                "categories"
            )
        return self


ColumnSpec = Annotated[NumericColumn | CategoricalColumn, Field(discriminator="type")]


def _declared_fill(missing: MissingConstant | MissingIndicator | None) -> float | str | None:
    if isinstance(missing, MissingConstant):
        return missing.value
    if isinstance(missing, MissingIndicator):
        return missing.fill
    return None


def _category_text(value: float | str) -> str | None:
    """A fill's text as categories are matched (a whole number 2.0 is '2')."""
    if isinstance(value, str):
        return value
    return str(int(value)) if math.isfinite(value) and value == int(value) else None


_COLUMNS = TypeAdapter(list[ColumnSpec])


def declared_columns(stored: Any) -> list[NumericColumn | CategoricalColumn] | None:
    """The ``columns`` declaration kept in ``datasets.feature_range`` (a list of column
    objects), or None for a dataset declared with ``feature_range`` (``[lo, hi]`` or an
    object of ranges)."""
    if isinstance(stored, list) and stored and all(isinstance(c, dict) for c in stored):
        return _COLUMNS.validate_python(stored, strict=False)
    return None


def feature_names_of(columns: list[NumericColumn | CategoricalColumn]) -> list[str]:
    """The features a declaration encodes to, in order: a numeric column is itself; a
    categorical column one feature ``<name>=<category>`` per declared category; an indicator
    policy adds ``<name>_missing`` after the column's features."""
    names: list[str] = []
    for column in columns:
        if isinstance(column, NumericColumn):
            names.append(column.name)
        else:
            names.extend(f"{column.name}={c}" for c in column.categories)
        if isinstance(column.missing, MissingIndicator):
            names.append(f"{column.name}_missing")
    return names


class DatasetMetadata(StrictBody):
    """The JSON sent as the ``metadata`` part of ``POST /datasets``, read as strictly as any
    JSON body (``StrictBody``: "epsilon": true or "1" is refused).

    ``feature_range`` (or ``columns``) and ``classes`` are public facts declared by the owner;
    dprelease never derives them from the data.
    """

    name: str = Field(min_length=1, max_length=200)
    label_column: str | None = Field(
        default=None, description="CSV/Parquet: the column holding labels (required there)"
    )
    feature_range: Range | dict[str, Range] | None = Field(
        default=None,
        description=(
            "Public bounds [lo, hi] for every feature, or an object mapping every feature "
            "column to its [lo, hi] (NPZ features are named by their flat index: '0', '1', …). "
            "Required unless `columns` is given; not both"
        ),
    )
    columns: list[ColumnSpec] | None = Field(
        default=None,
        description="The declared schema of every feature column (public), instead of "
        "feature_range: numeric columns with bounds, categorical columns with their category "
        "set, each with an optional missing-value policy. CSV and Parquet; NPZ takes numeric "
        "columns only",
    )
    classes: list[ClassLabel] | None = Field(
        default=None,
        description="The declared label set (public). When omitted, the labels present in "
        "the file are recorded for the owner's eyes only, and the dataset takes no release "
        "(every mechanism publishes labels): 409 classes_undeclared",
    )
    feature_shape: list[Annotated[JsonInt, Field(ge=1)]] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description="Public: the shape of one record, e.g. [28, 28] for images uploaded as 784 "
        "flat columns in row-major order; its product must be the number of features. Image "
        "shapes (two or more axes) get image defaults (a 2-D DCT basis, image clip norms), so "
        "the same images uploaded flat with this, or as an NPZ array of that shape, get the "
        "same release. Default: an NPZ array's own record shape, else one axis of d features",
    )
    budget: Budget

    @field_validator("feature_range")
    @classmethod
    def _ranges_valid(
        cls, value: Range | dict[str, Range] | None
    ) -> Range | dict[str, Range] | None:
        if value is None:
            return value
        ranges = value.values() if isinstance(value, dict) else [value]
        for lo, hi in ranges:
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError("feature_range bounds must be finite numbers")
            if not lo < hi:
                raise ValueError(f"feature_range needs lo < hi, got [{lo}, {hi}]")
        if isinstance(value, dict) and not value:
            raise ValueError("feature_range object must name at least one column")
        return value

    @model_validator(mode="after")
    def _columns_valid(self) -> DatasetMetadata:
        if self.columns is None:
            if self.feature_range is None:
                raise ValueError("give feature_range (or columns): the public feature bounds")
            return self
        if self.feature_range is not None:
            raise ValueError("give feature_range or columns, not both")
        if not self.columns:
            raise ValueError("columns must declare at least one column")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"columns: {dup!r} is declared more than once")
        if self.label_column is not None and self.label_column in names:
            raise ValueError(
                f"columns: the label column {self.label_column!r} is not a feature; declare "
                "its labels in `classes`"
            )
        features = feature_names_of(self.columns)
        if len(set(features)) != len(features):
            dup = next(n for n in features if features.count(n) > 1)
            raise ValueError(
                f"columns: the encoded feature name {dup!r} arises twice (one-hot features "
                "are '<column>=<category>', indicators '<column>_missing'); rename a column"
            )
        return self

    @model_validator(mode="after")
    def _classes_distinct(self) -> DatasetMetadata:
        if self.classes is not None:
            if len(self.classes) < 2:
                raise ValueError("classes must list at least two labels")
            if len({str(c) for c in self.classes}) != len(self.classes):
                raise ValueError("classes must be distinct")
        return self


class BudgetStatus(BaseModel):
    epsilon: float
    delta: float
    spent: float = Field(description="ε of committed releases under the ledger's filter")
    reserved: float = Field(description="ε of committed and in-flight releases, filter")
    remaining: float = Field(description="budget ε minus the reserved total, rounded down")
    delta_spent: float = Field(description="δ of committed releases under the filter")
    delta_reserved: float = Field(description="δ of committed and in-flight releases")
    delta_remaining: float = Field(description="budget δ minus the reserved δ, rounded down")


class DatasetOut(BaseModel):
    id: str
    name: str
    format: str
    n_rows: int
    n_features: int
    feature_shape: list[int]
    classes: list[ClassLabel] | None = Field(
        description="The declared label set; when the owner declared none, the labels found "
        "in the file (private data): owner only, null for everyone else"
    )
    columns: list[ColumnSpec] | None = Field(
        default=None,
        description="The declared column schema (public), when the upload gave `columns`: "
        "how the features '<column>=<category>' and '<column>_missing' decode",
    )
    classes_declared_by_owner: bool = Field(
        description="false: no label set was declared at upload; the dataset takes no release"
    )
    sha256: str | None = Field(
        description="sha256 of the uploaded file; computed from private data: owner only"
    )
    size_bytes: int | None = Field(
        description="Size of the uploaded file in bytes; it differs between neighbouring "
        "datasets (a record's text length), so it is the owner's only: null for everyone "
        "else, admins included"
    )
    clipped_values: int | None = Field(
        description="Feature values outside feature_range, clipped; owner only (erased, "
        "null, once the dataset is deleted)"
    )
    budget: BudgetStatus
    created_at: datetime
    status: Literal["active", "deleted"] = Field(
        description="deleted: the raw data is erased and no new release is accepted; the "
        "ledger and the releases already made stay"
    )
    deleted_at: datetime | None = None


class DatasetList(BaseModel):
    items: list[DatasetOut]


class GrantIn(StrictBody):
    principal_id: str = Field(description="The analyst principal to grant access to releases")


class GrantOut(BaseModel):
    id: str
    dataset_id: str
    principal_id: str
    created_at: datetime


class GrantList(BaseModel):
    items: list[GrantOut]
