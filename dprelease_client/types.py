"""The API's JSON answers as ``TypedDict`` s (``total=False``: a field the server leaves out, or
adds in a later version, never breaks a caller). They are plain dicts at run time, so the
client needs no pydantic and a notebook can print or index them as returned. Nested objects
(noise, charge, budgets, artifacts) stay ``dict[str, Any]``: their exact shape is the API's
(``openapi/openapi.json``), not something this light client re-declares."""

from __future__ import annotations

from typing import Any, TypedDict


class ApiKeyCreated(TypedDict, total=False):
    key: str
    key_id: str
    principal_id: str
    name: str
    role: str
    created_at: str
    expires_at: str | None


class ApiKey(TypedDict, total=False):
    id: str
    principal_id: str
    name: str
    role: str
    active: bool
    bootstrap: bool
    created_at: str
    expires_at: str | None
    revoked_at: str | None


class ApiKeyList(TypedDict, total=False):
    items: list[ApiKey]


class Me(TypedDict, total=False):
    principal_id: str
    name: str
    role: str


class Dataset(TypedDict, total=False):
    id: str
    name: str
    status: str
    format: str
    n_rows: int
    n_features: int
    feature_shape: list[int]
    classes: list[Any] | None
    classes_declared_by_owner: bool
    clipped_values: int
    sha256: str
    size_bytes: int
    budget: dict[str, Any]
    created_at: str
    deleted_at: str | None


class DatasetList(TypedDict, total=False):
    items: list[Dataset]


class Grant(TypedDict, total=False):
    id: str
    dataset_id: str
    principal_id: str
    created_at: str


class GrantList(TypedDict, total=False):
    items: list[Grant]


class Release(TypedDict, total=False):
    id: str
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    format: str
    status: str
    progress: float
    phase: str | None
    noise: dict[str, Any]
    charge: dict[str, Any]
    # What became of the charge: {state, because} (docs/privacy.md, "Failures and
    # cancellations"); None for a research release.
    settlement: dict[str, Any] | None
    accountant: str
    research: dict[str, Any] | None
    error: dict[str, Any] | None
    artifact: dict[str, Any] | None
    artifacts: list[dict[str, Any]]
    report: dict[str, Any] | None
    attempts: int
    timings: dict[str, Any] | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class ReleaseList(TypedDict, total=False):
    items: list[Release]


class Preview(TypedDict, total=False):
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    accountant: str
    noise: dict[str, Any]
    charge: dict[str, Any]
    budget: dict[str, Any]
    research: dict[str, Any] | None
    warnings: list[dict[str, Any]]
    noise_guide: dict[str, Any]  # the noise against each column's declared range
    # Per mechanism, the configuration measured best on the nearest public dataset shape.
    recommended: list[dict[str, Any]]


class Ledger(TypedDict, total=False):
    dataset_id: str
    epsilon: float
    delta: float
    spent: float
    reserved: float
    remaining: float
    delta_spent: float
    delta_reserved: float
    delta_remaining: float
    entries: list[dict[str, Any]]


class BudgetSummary(TypedDict, total=False):
    dataset_id: str
    dataset_name: str
    epsilon: float
    delta: float
    spent: float
    reserved: float
    remaining: float
    delta_spent: float
    delta_reserved: float
    delta_remaining: float
    release_count: int


class BudgetList(TypedDict, total=False):
    items: list[BudgetSummary]


class Mechanism(TypedDict, total=False):
    name: str
    summary: str
    kind: str  # "mechanism" or "baseline" (a comparison point, not a choice)
    good_for: str
    reference: str
    accountants: list[Any]
    output: Any
    label_kind: str  # "exact", "proportions" or "combinations": the release tables' labels
    params_schema: dict[str, Any]


class MechanismList(TypedDict, total=False):
    items: list[Mechanism]


class AuditEvent(TypedDict, total=False):
    id: Any
    at: str
    actor: str | None
    action: str
    object_type: str
    object_id: str | None
    detail: dict[str, Any]


class AuditPage(TypedDict, total=False):
    items: list[AuditEvent]
    next_cursor: str | None


class Health(TypedDict, total=False):
    status: str


class Readiness(TypedDict, total=False):
    status: str
    checks: dict[str, Any]
