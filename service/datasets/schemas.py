"""Request and response bodies of the datasets domain."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

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


class DatasetMetadata(StrictBody):
    """The JSON sent as the ``metadata`` part of ``POST /datasets``, read as strictly as any
    JSON body (``StrictBody``: "epsilon": true or "1" is refused).

    ``feature_range`` and ``classes`` are public facts declared by the owner; dprelease never
    derives them from the data.
    """

    name: str = Field(min_length=1, max_length=200)
    label_column: str | None = Field(
        default=None, description="CSV/Parquet: the column holding labels (required there)"
    )
    feature_range: Range | dict[str, Range] = Field(
        description=(
            "Public bounds [lo, hi] for every feature, or an object mapping every feature "
            "column to its [lo, hi] (NPZ features are named by their flat index: '0', '1', …)"
        )
    )
    classes: list[ClassLabel] | None = Field(
        default=None,
        description="The declared label set (public). When omitted, the labels present in "
        "the file are recorded for the owner's eyes only, and the dataset takes no release "
        "(every mechanism publishes labels): 409 classes_undeclared",
    )
    budget: Budget

    @field_validator("feature_range")
    @classmethod
    def _ranges_valid(cls, value: Range | dict[str, Range]) -> Range | dict[str, Range]:
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
