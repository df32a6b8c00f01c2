"""Object-level access: who may see which dataset, release and grant.

Owners see their own datasets and releases; analysts see releases of datasets they were
granted; admins read everything — except research releases (``service.releases.research``),
which only the dataset's owner sees. Anything else answers 404, exactly like a missing id (same
status, code and message), so an id never tells a caller that an object exists. Role checks
(403) run before any lookup and so say nothing about ids either.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import owner_only
from service.auth.schemas import Role
from service.errors import DatasetDeleted, NotFound
from service.models import Dataset, Grant, Principal, Release


def has_grant(session: Session, *, dataset_id: str, principal_id: str) -> bool:
    stmt = select(Grant.id).where(
        Grant.dataset_id == dataset_id, Grant.principal_id == principal_id
    )
    return session.scalars(stmt).first() is not None


def granted_dataset_ids(session: Session, *, principal_id: str) -> list[str]:
    stmt = select(Grant.dataset_id).where(Grant.principal_id == principal_id)
    return list(session.scalars(stmt))


def can_read_dataset(session: Session, *, principal: Principal, dataset: Dataset) -> bool:
    if principal.role == Role.admin:
        return True
    if principal.role == Role.owner:
        return dataset.owner_id == principal.id
    return has_grant(session, dataset_id=dataset.id, principal_id=principal.id)


def dataset_for(
    session: Session, *, principal: Principal, dataset_id: str, manage: bool = False
) -> Dataset:
    """The dataset if the caller may read it (or, with ``manage``, act as its owner)."""
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found")
    allowed = (
        dataset.owner_id == principal.id
        if manage
        else can_read_dataset(session, principal=principal, dataset=dataset)
    )
    if not allowed:
        raise NotFound(f"dataset {dataset_id} not found")
    return dataset


def release_for(
    session: Session, *, principal: Principal, release_id: str, manage: bool = False
) -> Release:
    """The release if the caller may read it (or, with ``manage``, act on it as the owner of
    its dataset)."""
    release = session.get(Release, release_id)
    if release is None:
        raise NotFound(f"release {release_id} not found")
    dataset = session.get(Dataset, release.dataset_id)
    allowed = (
        dataset is not None
        and may_see(release, principal)
        and (
            dataset.owner_id == principal.id
            if manage
            else can_read_dataset(session, principal=principal, dataset=dataset)
        )
    )
    if not allowed:
        raise NotFound(f"release {release_id} not found")
    # Its owner's request about a research release leaves no trace for the operator (no
    # request timing, no log line): ``service.owner_only``.
    owner_only.mark(release.research is not None)
    return release


def may_see(release: Release, principal: Principal) -> bool:
    """Within datasets the caller may read: every release but another owner's research
    release (only the owner of a research release's dataset requested it: ``plan`` reads the
    dataset with ``manage``)."""
    return release.research is None or release.requested_by == principal.id


def grant_for(session: Session, *, dataset: Dataset, grant_id: str) -> Grant:
    """A grant of ``dataset`` (already checked); a grant of any other dataset is 404."""
    grant = session.get(Grant, grant_id)
    if grant is None or grant.dataset_id != dataset.id:
        raise NotFound(f"grant {grant_id} not found")
    return grant


def require_active(dataset: Dataset) -> None:
    if dataset.deleted_at is not None:
        raise DatasetDeleted(
            f"dataset {dataset.id} was deleted: its raw data is erased and it takes no new "
            f"releases (its releases and ledger stay readable)",
            detail={"dataset_id": dataset.id, "deleted_at": dataset.deleted_at.isoformat()},
        )
