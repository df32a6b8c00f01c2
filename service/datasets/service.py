"""Upload, validation and reading of datasets."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError
from sqlalchemy.orm import Session

from dpcore.release_layout import DEFAULT_LABEL, collisions
from service import idempotency, strict_json
from service.access import dataset_for, grant_for, granted_dataset_ids
from service.audit_trail import service as audit
from service.auth.schemas import Role
from service.budgets import repository as budget_repository
from service.budgets import service as budget_service
from service.config import Settings
from service.datasets import repository
from service.datasets.parsing import ParsedDataset, UploadLimits, detect_format
from service.datasets.schemas import (
    DatasetMetadata,
    DatasetOut,
    GrantOut,
    declared_columns,
)
from service.db import on_rollback
from service.errors import InvalidInput, LabelColumnClash, NotFound, ReleasesPending
from service.models import Dataset, Grant, Principal, new_id, utcnow
from service.releases import keys as release_keys
from service.releases import repository as release_repository
from service.storage import ObjectStore, sha256_hex

UPLOAD_SCOPE = "POST /datasets"  # the Idempotency-Key scope of uploads


def parse_metadata(raw: str) -> DatasetMetadata:
    try:
        payload = strict_json.loads(raw)
    except strict_json.DuplicateKey as exc:
        raise InvalidInput(f"metadata: {exc}: give each key once") from exc
    except strict_json.NulCharacter:
        raise InvalidInput(str(strict_json.NulCharacter("metadata"))) from None
    except strict_json.TooDeep as exc:
        raise InvalidInput(f"metadata: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"metadata is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from exc
    try:
        return DatasetMetadata.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'metadata'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidInput(f"invalid metadata: {problems}") from exc


@dataclass(frozen=True, eq=False)
class CheckedUpload:
    """An upload validated and parsed, before anything is stored or any row locked."""

    content: bytes
    filename: str
    fmt: str
    metadata: DatasetMetadata
    parsed: ParsedDataset
    limits: UploadLimits


def upload_limits(settings: Settings) -> UploadLimits:
    """The caps an upload is accepted under now (DPRELEASE_MAX_UPLOAD_*)."""
    return UploadLimits(
        settings.max_upload_bytes,
        settings.max_upload_cells,
        settings.max_upload_decoded_bytes,
        settings.max_upload_features,
    )


def check(
    *, content: bytes, filename: str, metadata_json: str, settings: Settings
) -> CheckedUpload:
    """Validate and parse an upload: a pure function of the request (no session, no store),
    so the endpoint runs it, off the event loop, before it takes a database connection or an
    Idempotency-Key row lock. Sizes are bounded from the file's metadata before decoding
    (``parsing.parse_dataset``)."""
    metadata = parse_metadata(metadata_json)
    fmt = detect_format(filename)
    limits = upload_limits(settings)
    parsed = limits.parse(content=content, filename=filename, metadata=metadata)
    _check_release_columns(metadata, parsed)
    return CheckedUpload(content, filename, fmt, metadata, parsed, limits)


def _check_release_columns(metadata: DatasetMetadata, parsed: ParsedDataset) -> None:
    """A release table names its features as the dataset does and its label column(s)
    ``<label>`` or ``<label>=<class>`` (``dpcore.release_layout``): refuse a dataset where any
    of these would repeat a feature's name, whatever mechanism is asked later. Public names
    only (declared classes; without them the dataset takes no release anyway)."""
    if not parsed.classes_declared:
        return
    clash = collisions(parsed.feature_names, metadata.label_column, parsed.classes)
    if clash:
        label = metadata.label_column or DEFAULT_LABEL
        raise LabelColumnClash(
            f"a release of this dataset would name label column(s) {clash} (the label "
            f"column {label!r} as is, or '{label}=<class>' per class), and so is a feature: "
            "rename the label column or that feature",
            detail={"columns": clash},
        )


def create(
    session: Session, *, principal: Principal, upload: CheckedUpload, store: ObjectStore
) -> Dataset:
    """Record and store a checked upload; stores nothing unless the unit commits."""
    content, filename, fmt = upload.content, upload.filename, upload.fmt
    metadata, parsed = upload.metadata, upload.parsed
    dataset_id = new_id()
    key = f"datasets/{dataset_id}/raw.{fmt}"
    dataset = repository.add(
        session,
        Dataset(
            id=dataset_id,
            owner_id=principal.id,
            name=metadata.name,
            format=fmt,
            filename=filename,
            storage_key=key,
            sha256=sha256_hex(content),
            size_bytes=len(content),
            n_rows=parsed.n_rows,
            n_features=parsed.n_features,
            feature_shape=list(parsed.feature_shape),
            label_column=metadata.label_column,
            classes=list(parsed.classes),
            classes_declared=parsed.classes_declared,
            feature_range=_jsonable_range(metadata),
            clipped_values=parsed.clipped_values,
            upload_limits=upload.limits.to_json(),
            class_counts=[
                int(c) for c in np.bincount(parsed.labels, minlength=len(parsed.classes))
            ],
        ),
    )
    budget_repository.add_budget(
        session,
        dataset_id=dataset_id,
        epsilon=metadata.budget.epsilon,
        delta=metadata.budget.delta,
    )
    audit.record(
        session,
        actor=principal.id,
        action="dataset.created",
        object_type="dataset",
        object_id=dataset_id,
        detail={
            "name": metadata.name,
            "format": fmt,
            "n_rows": parsed.n_rows,  # public (replace-one neighbours), as is the shape
            "n_features": parsed.n_features,
            "budget": {"epsilon": metadata.budget.epsilon, "delta": metadata.budget.delta},
        },
    )
    store.put(key, content)
    on_rollback(session, lambda: store.delete(key))
    return dataset


def _jsonable_range(metadata: DatasetMetadata) -> object:
    """The declared bounds as stored in ``datasets.feature_range`` (JSON): ``[lo, hi]``, an
    object of per-column ranges, or (in the same column, no migration) the declared ``columns``
    as a list of column objects, told apart from ``[lo, hi]`` by its items being objects."""
    if metadata.columns is not None:
        return [column.model_dump(mode="json") for column in metadata.columns]
    fr = metadata.feature_range
    assert fr is not None  # the schema asks for feature_range or columns
    if isinstance(fr, dict):
        return {name: [lo, hi] for name, (lo, hi) in fr.items()}
    return [fr[0], fr[1]]


def to_out(session: Session, dataset: Dataset, *, viewer: Principal) -> DatasetOut:
    """The dataset as ``viewer`` may see it. Figures computed from the raw file and not
    covered by any privacy charge are the owner's alone (admins included in "everyone
    else"): its hash, its size in bytes, the clipped count, and the labels present when no
    label set was declared. What stays shared is public under replace-one neighbours with n
    public: n, the shape, the declared bounds and classes, the owner's name for it."""
    budget = budget_repository.get_budget(session, dataset_id=dataset.id)
    if budget is None:
        raise NotFound(f"dataset {dataset.id} not found")
    owner = dataset.owner_id == viewer.id
    return DatasetOut(
        id=dataset.id,
        name=dataset.name,
        format=dataset.format,
        n_rows=dataset.n_rows,
        n_features=dataset.n_features,
        feature_shape=dataset.feature_shape,
        classes=dataset.classes if owner or dataset.classes_declared else None,
        classes_declared_by_owner=dataset.classes_declared,
        sha256=dataset.sha256 if owner else None,
        size_bytes=dataset.size_bytes if owner else None,
        clipped_values=dataset.clipped_values if owner else None,
        columns=declared_columns(dataset.feature_range),
        budget=budget_service.status_of(session, budget=budget),
        created_at=dataset.created_at,
        status="deleted" if dataset.deleted_at is not None else "active",
        deleted_at=dataset.deleted_at,
    )


def list_visible(session: Session, *, principal: Principal) -> list[Dataset]:
    if principal.role == Role.admin:
        return repository.list_by_ids(session, ids=None)
    if principal.role == Role.owner:
        return repository.list_owned(session, owner_id=principal.id)
    return repository.list_by_ids(
        session, ids=granted_dataset_ids(session, principal_id=principal.id)
    )


def get(session: Session, *, principal: Principal, dataset_id: str) -> Dataset:
    return dataset_for(session, principal=principal, dataset_id=dataset_id)


def delete(
    session: Session, *, principal: Principal, dataset_id: str, store: ObjectStore
) -> Dataset:
    """Erase the raw data of the caller's dataset and mark it deleted; idempotent.

    The budget row is locked first, as admission locks it, so no release can be admitted
    while this runs; deletion is refused while a release that reads the raw data is queued or
    running. Objects are deleted before the transaction commits: if that fails nothing is
    marked deleted (a retry finishes the job), so "deleted" always means "erased".
    """
    dataset = dataset_for(session, principal=principal, dataset_id=dataset_id, manage=True)
    budget_repository.lock_budgets(session, dataset_ids=[dataset.id])
    session.refresh(dataset)  # as committed by whoever held the lock before us
    pending = release_repository.pending_using(session, dataset_id=dataset.id)
    if pending:
        raise ReleasesPending(
            f"dataset {dataset.id} is read by {len(pending)} queued or running release(s); "
            f"delete it once they have finished",
            detail={"release_ids": pending},
        )
    # The raw file, and the owner reports computed on it as a held-out set (not DP). The
    # releases themselves are DP outputs and stay; so do their provenance files.
    store.delete(dataset.storage_key)
    for release_id in release_repository.reporting_on(session, dataset_id=dataset.id):
        store.delete(release_keys.report(release_id))
    if dataset.deleted_at is None:
        dataset.deleted_at = utcnow()
        dataset.deleted_by = principal.id
        audit.record(
            session,
            actor=principal.id,
            action="dataset.deleted",
            object_type="dataset",
            object_id=dataset.id,
            detail={"raw_data": "erased"},
        )
    dataset.class_counts = None
    dataset.clipped_values = None
    session.flush()
    idempotency.rewrite_replays(
        session,
        principal_id=dataset.owner_id,
        scope=UPLOAD_SCOPE,
        object_id=dataset.id,
        body=to_out(session, dataset, viewer=principal),
    )
    return dataset


def list_grants(session: Session, *, principal: Principal, dataset_id: str) -> list[GrantOut]:
    dataset = dataset_for(session, principal=principal, dataset_id=dataset_id)
    return [_grant_out(g) for g in repository.list_grants(session, dataset_id=dataset.id)]


def revoke_grant(session: Session, *, principal: Principal, dataset_id: str, grant_id: str) -> None:
    dataset = dataset_for(session, principal=principal, dataset_id=dataset_id, manage=True)
    grant = grant_for(session, dataset=dataset, grant_id=grant_id)
    audit.record(
        session,
        actor=principal.id,
        action="grant.revoked",
        object_type="grant",
        object_id=grant.id,
        detail={"dataset_id": dataset.id, "principal_id": grant.principal_id},
    )
    repository.delete_grant(session, grant)


def _grant_out(row: Grant) -> GrantOut:
    return GrantOut(
        id=row.id,
        dataset_id=row.dataset_id,
        principal_id=row.principal_id,
        created_at=row.created_at,
    )


def grant(session: Session, *, principal: Principal, dataset_id: str, analyst_id: str) -> GrantOut:
    dataset = dataset_for(session, principal=principal, dataset_id=dataset_id, manage=True)
    analyst = repository.get_principal(session, principal_id=analyst_id)
    if analyst is None or analyst.role != Role.analyst:
        raise InvalidInput(f"principal {analyst_id} is not an analyst; grants go to analysts")
    row = repository.find_grant(session, dataset_id=dataset.id, principal_id=analyst_id)
    if row is None:
        row = repository.add_grant(
            session, Grant(dataset_id=dataset.id, principal_id=analyst_id, granted_by=principal.id)
        )
        audit.record(
            session,
            actor=principal.id,
            action="grant.created",
            object_type="grant",
            object_id=row.id,
            detail={"dataset_id": dataset.id, "principal_id": analyst_id},
        )
    return _grant_out(row)
