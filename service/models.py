"""Tables. Ids are random UUID strings; times are timezone-aware UTC."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db import Base
from service.releases.status import ReleaseStatus


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(UTC)


class TZDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime; use service.models.utcnow()")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class StatusType(TypeDecorator[ReleaseStatus]):
    """A release status: stored as its string, read back as ``ReleaseStatus`` (an unknown
    value is refused before it reaches the database's CHECK constraint)."""

    impl = String(16)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else ReleaseStatus(value).value

    def process_result_value(self, value: str | None, dialect: Any) -> ReleaseStatus | None:
        return None if value is None else ReleaseStatus(value)


class Principal(Base):
    """Someone who calls the API: an owner, an analyst or an admin."""

    __tablename__ = "principals"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    # Refused from this instant on (None: never expires).
    expires_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    # Registered at start-up from the configured admin key; revoked when that setting changes.
    bootstrap: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    def refusal(self, now: datetime) -> str | None:
        """Why this key may not be used at ``now``, or None when it may."""
        if self.revoked_at is not None:
            return "revoked API key"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired API key"
        return None


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(16))
    filename: Mapped[str] = mapped_column(String(500))
    storage_key: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    n_rows: Mapped[int] = mapped_column(Integer)
    n_features: Mapped[int] = mapped_column(Integer)
    feature_shape: Mapped[list[int]] = mapped_column(JSON)
    label_column: Mapped[str | None] = mapped_column(String(200), nullable=True)
    classes: Mapped[list[Any]] = mapped_column(JSON)
    classes_declared: Mapped[bool] = mapped_column(Boolean)
    feature_range: Mapped[Any] = mapped_column(JSON)
    # Statistics of the raw data (owner only); both are erased with it (None).
    clipped_values: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The caps the upload was accepted under (``parsing.UploadLimits``): a job parses the
    # stored file again under them. Null for uploads older than the column.
    upload_limits: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Rows per class, in the order of `classes`. Private: used only to check an owner's
    # declared lower bound at admission, and never shown to anyone else.
    class_counts: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)
    # Set when the owner deleted the dataset: its raw data is erased, it takes no new
    # releases, and its ledger, grants and releases stay.
    deleted_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    deleted_by: Mapped[str | None] = mapped_column(ForeignKey("principals.id"), nullable=True)


class DatasetBudget(Base):
    """The row admission locks (``SELECT … FOR UPDATE``) while it composes the ledger."""

    __tablename__ = "budgets"

    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)


class Grant(Base):
    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("dataset_id", "principal_id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    granted_by: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)


class Release(Base):
    __tablename__ = "releases"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s.value}'" for s in ReleaseStatus)),
            name="ck_releases_status",
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    requested_by: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    mechanism: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    accountant: Mapped[str] = mapped_column(String(16))
    format: Mapped[str] = mapped_column(String(16))
    # The accountant's noise description (dpcore.accounting.events.NoiseDescription JSON;
    # rows from before 0009 hold only {"sigma_x", "sigma_y"}: see service.releases.noise).
    noise: Mapped[dict[str, Any]] = mapped_column(JSON)
    # "secure" (lattice + exact rounded Gaussian from the CSPRNG) or "fast" (torch floats).
    noise_sampler: Mapped[str] = mapped_column(
        String(16), default="secure", server_default="secure"
    )
    epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    # The job's declared work in multiply-adds (its spec's ``Admission.work``, from public
    # figures), computed at admission: its lane in real mode (service.releases.mechanisms.route).
    # Null where the mechanism declares none, and for releases admitted before 0019.
    work: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[ReleaseStatus] = mapped_column(StatusType(), default=ReleaseStatus.queued)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # What the job last reported it was doing, in the mechanism's words ("rows" when the
    # worker counts rows); null until it reports.
    phase: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    # The last sign of life of its job: handed to the dispatcher again by the sweeper, started
    # for an attempt, or progress written (service.releases.sweeper reads how stale it is).
    touched_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    artifact_key: Mapped[str | None] = mapped_column(String(500), nullable=True)
    artifact_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    artifact_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    metadata_key: Mapped[str | None] = mapped_column(String(500), nullable=True)
    # Further files beside the artifact (service.releases.lifecycle): [{name, media_type,
    # description}] as the upload claim declared them, with bytes and sha256 once succeeded.
    artifacts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # The owner's held-out dataset for an owner-only utility report (raw data: never shared).
    report_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"), nullable=True)
    # A research release (an accountant whose ε is not a bound, run under the owner's opt-in):
    # {claimed_epsilon, claimed_delta, caveat, statement}; shown to the dataset's owner only,
    # charged nothing (service.releases.research). Null for every other release.
    research: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # When a job of it first began reading its dataset's content (recorded, under the row
    # lock, before the read): from then on whether it fails may depend on the private data,
    # so it is never refunded (service.releases.lifecycle). Set once, never cleared.
    private_read_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    # Its ledger entry (read-only here: only the ledger writes entries): how the filter
    # charged it, shown as the release's charge.
    ledger_entry: Mapped[LedgerEntry | None] = relationship(
        "LedgerEntry",
        primaryjoin="Release.id == foreign(LedgerEntry.release_id)",
        viewonly=True,
        uselist=False,
    )


class LedgerEntry(Base):
    """One release's cost. Entries are never deleted; state only moves reserved → final. A
    research release's entry is born in its final state ``research``, at zero cost."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint(
            "(charged_as = 'basic') OR (charged_as = 'renyi' AND group_delta IS NOT NULL "
            "AND rdp IS NOT NULL)",
            name="ck_ledger_entries_charged_as",
        ),
        # A research entry (an owner-only release whose accountant is not a bound) is free,
        # and only research entries are state 'research' (migration 0014).
        CheckConstraint(
            "(state <> 'research') OR (epsilon = 0 AND delta = 0 AND consumed_epsilon = 0 "
            "AND consumed_delta = 0 AND charged_as = 'basic')",
            name="ck_ledger_entries_research_free",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    release_id: Mapped[str] = mapped_column(ForeignKey("releases.id"), unique=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    description: Mapped[dict[str, Any]] = mapped_column(JSON)
    epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    rdp: Mapped[list[float] | None] = mapped_column(JSON, nullable=True)
    mu: Mapped[float | None] = mapped_column(Float, nullable=True)
    # How the privacy filter charged it (dpcore.accounting.filter), fixed at admission:
    # "basic" composes (epsilon, delta); "renyi" composes rdp in a group holding group_delta.
    charged_as: Mapped[str] = mapped_column(String(8), default="basic", server_default="basic")
    group_delta: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What admission added to the filter's spent ε and δ (shown as the release's charge).
    consumed_epsilon: Mapped[float | None] = mapped_column(Float, nullable=True)
    consumed_delta: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="reserved")
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)
    settled_at: Mapped[datetime | None] = mapped_column(TZDateTime(), nullable=True)
    # Why it was settled as it was (service.budgets.service.SETTLED_BECAUSE); null while
    # reserved, for research entries and for entries settled before migration 0017.
    settled_because: Mapped[str | None] = mapped_column(String(32), nullable=True)


class IdempotencyRecord(Base):
    """The first response to a POST with an ``Idempotency-Key``, replayed for repeats."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("principal_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    key: Mapped[str] = mapped_column(String(200))
    scope: Mapped[str] = mapped_column(String(100))
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow)


class AuditEvent(Base):
    """One state change: who (a principal id, or "worker"/"system"), when, what, on which
    object. Append-only: nothing updates or deletes a row, and a database trigger refuses
    both. ``detail`` is small and never holds secrets, raw data or owner-only statistics."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_object", "object_type", "object_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(TZDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64), index=True)
    action: Mapped[str] = mapped_column(String(64))
    object_type: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class SweeperLease(Base):
    """Who may sweep now (``service.releases.sweeper``): one row per sweeper name, held by one
    process until ``expires_at``; the holder renews it at each pass, another process takes it
    only once it has expired. Plain rows and conditional UPDATEs: the same on SQLite and
    Postgres."""

    __tablename__ = "sweeper_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(TZDateTime())
