"""What a release's job works from: a read-only view of the release, its dataset, budget and
parameters, read once (in the transaction that starts or resumes the attempt) through the
repositories and never from the ORM rows again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from dpcore.accounting.events import NoiseDescription
from service import owner_only
from service.budgets import repository as budgets
from service.datasets import repository as datasets
from service.datasets.schemas import Budget, DatasetMetadata, declared_columns
from service.db import transaction
from service.models import Dataset, DatasetBudget, Release
from service.releases import keys, lifecycle
from service.releases import noise as release_noise
from service.runtime import Runtime


@dataclass(frozen=True)
class Job:
    release_id: str
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    fmt: str
    noise: NoiseDescription
    noise_sampler: str
    epsilon: float
    delta: float
    accountant: str
    attempt: int
    dataset_key: str
    dataset_sha256: str
    dataset_filename: str
    metadata: DatasetMetadata
    # The caps the upload was accepted under (null for older uploads: the server's own).
    dataset_limits: dict[str, Any] | None = None
    # key, sha, file, meta, accepted caps
    report_dataset: tuple[str, str, str, DatasetMetadata, dict[str, Any] | None] | None = None
    # Further files an earlier attempt's upload claim declared (none before any claim).
    declared: tuple[lifecycle.ArtifactRecord, ...] = ()
    # A research release's claim (service.releases.research): stated in its metadata.
    research: dict[str, Any] | None = None
    # When the release was requested (public): the metadata's ``created_at``. Not the time the
    # job wrote it, which would date the job's end for every reader of the file.
    requested_at: datetime | None = None
    # The job's declared work (``releases.work``): its shard and finaliser tasks take the
    # release's lane (``service.releases.mechanisms.route``).
    work: float | None = None

    @property
    def artifact_key(self) -> str:
        return keys.artifact(self.release_id, self.fmt)

    @property
    def raw_key(self) -> str:
        return keys.raw(self.release_id, self.fmt)

    @property
    def report_key(self) -> str:
        return keys.report(self.release_id)

    @property
    def metadata_key(self) -> str:
        return keys.metadata(self.release_id)


def start(runtime: Runtime, release_id: str) -> Job | None:
    """Start the release's next attempt (``lifecycle.start``) and return its job; None when
    there is nothing to run."""
    with transaction(runtime.session_factory) as session:
        release = lifecycle.start(
            session,
            release_id,
            max_attempts=runtime.settings.task_max_attempts,
        )
        return None if release is None else job_of(session, release)


def resume(runtime: Runtime, release_id: str, attempt: int) -> Job | None:
    """The job of a release running in ``attempt`` (a shard or the finaliser of that
    attempt's split), or None when it is not (settled, or handed over to a later attempt)."""
    with transaction(runtime.session_factory) as session:
        release = lifecycle.current(session, release_id, attempt)
        return None if release is None else job_of(session, release)


def job_of(session: Session, release: Release) -> Job:
    """What the job needs of the release and its datasets, read in the start's transaction."""
    # A research release's job leaves no log record for the operator (service.owner_only).
    owner_only.mark(release.research is not None)
    dataset = datasets.get(session, release.dataset_id)
    budget = budgets.get_budget(session, dataset_id=release.dataset_id)
    assert dataset is not None and budget is not None
    report_dataset = None
    if release.report_dataset_id is not None:
        test = datasets.get(session, release.report_dataset_id)
        test_budget = budgets.get_budget(session, dataset_id=release.report_dataset_id)
        # An erased held-out set gives no report (the report endpoint answers 410).
        if test is not None and test_budget is not None and test.deleted_at is None:
            report_dataset = (
                test.storage_key,
                test.sha256,
                test.filename,
                _metadata_of(test, test_budget),
                test.upload_limits,
            )
    return Job(
        release_id=release.id,
        dataset_id=dataset.id,
        mechanism=release.mechanism,
        params=dict(release.params),
        fmt=release.format,
        noise=release_noise.description(release, dataset),
        noise_sampler=release.noise_sampler,
        epsilon=release.epsilon,
        delta=release.delta,
        accountant=release.accountant,
        attempt=release.attempts,
        dataset_key=dataset.storage_key,
        dataset_sha256=dataset.sha256,
        dataset_filename=dataset.filename,
        metadata=_metadata_of(dataset, budget),
        dataset_limits=dataset.upload_limits,
        report_dataset=report_dataset,
        declared=lifecycle.declared_artifacts(release),
        research=release.research,
        requested_at=release.created_at,
        work=release.work,
    )


def _metadata_of(dataset: Dataset, budget: DatasetBudget) -> DatasetMetadata:
    """The upload's metadata as the owner sent it: ``classes`` only if declared (the labels
    found in an undeclared file are private, and parsing finds them again)."""
    columns = declared_columns(dataset.feature_range)
    return DatasetMetadata(
        name=dataset.name,
        label_column=dataset.label_column,
        feature_range=None if columns is not None else _range_from_json(dataset.feature_range),
        columns=columns,
        classes=dataset.classes if dataset.classes_declared else None,
        budget=Budget(epsilon=budget.epsilon, delta=budget.delta),
    )


def _range_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: (lo, hi) for name, (lo, hi) in value.items()}
    return (value[0], value[1])
