"""Typed errors raised by services and mapped to HTTP statuses at the request boundary.

Every error carries a machine-readable ``code`` and a message a person can act on; some carry
``detail`` (a JSON object) with the numbers behind the refusal.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServiceError(Exception):
    status_code: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}


class InvalidInput(ServiceError):
    """Input that passed schema validation but is still unusable (422)."""

    status_code = 422
    code = "invalid_input"


class ReleaseTooLarge(InvalidInput):
    """The release file would pass DPRELEASE_MAX_RELEASE_BYTES (422): estimated from public
    figures only (rows asked, declared width, the format)."""

    code = "release_too_large"


class JobTooLong(InvalidInput):
    """The job's declared work would pass DPRELEASE_MAX_JOB_WORK (422): estimated from
    public figures only (its parameters, the dataset's shape)."""

    code = "job_too_long"


class LabelColumnClash(InvalidInput):
    """A release table of the dataset would repeat a column name (422): its label column,
    or a '<label>=<class>' column, is also a feature's name."""

    code = "label_column_clash"


class NotAuthenticated(ServiceError):
    status_code = 401
    code = "not_authenticated"


class Forbidden(ServiceError):
    """The caller is known but its role may not do this (403)."""

    status_code = 403
    code = "forbidden"


class NotFound(ServiceError):
    """Missing, or belonging to another tenant: both answer 404 so ids leak nothing."""

    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class BudgetExceeded(Conflict):
    code = "budget_exceeded"


class DatasetDeleted(Conflict):
    """The dataset's raw data was erased: it takes no new releases (409)."""

    code = "dataset_deleted"


class ClassesUndeclared(Conflict):
    """The dataset's label set was not declared at upload: the labels found in the private
    data are the owner's alone, so nothing that publishes labels may be released (409)."""

    code = "classes_undeclared"


class ReleasesPending(Conflict):
    """A dataset cannot be erased while a job may still read it (409)."""

    code = "releases_pending"


class LastAdminKey(Conflict):
    """Revoking this key would leave no active admin key, and nobody able to create keys or
    audit (409): create another admin key first."""

    code = "last_admin_key"


class Gone(ServiceError):
    """The object existed and was erased for good (410)."""

    status_code = 410
    code = "erased"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


class UploadTooSlow(ServiceError):
    """An upload whose body arrived slower than DPRELEASE_UPLOAD_MIN_BYTES_PER_S (408): it was
    cut off so that it gives its upload slot back; nothing was stored."""

    status_code = 408
    code = "upload_too_slow"


class DatasetTooLarge(InvalidInput):
    """An upload whose size, cell count or estimated decoded size passes a limit (413). An
    ``InvalidInput`` (the file is unusable as it is) answered with 413: the message and
    ``detail`` name the limit and, from the file's metadata, what it would need."""

    status_code = 413
    code = "dataset_too_large"


class RetryLater(ServiceError):
    """A refusal a later retry may get past: answered with ``Retry-After``
    (``retry_after`` seconds), also in ``detail.retry_after_seconds``."""

    def __init__(self, message: str, *, retry_after: int, detail: dict[str, Any] | None = None):
        super().__init__(message, detail={"retry_after_seconds": retry_after, **(detail or {})})
        self.retry_after = retry_after


class RateLimited(RetryLater):
    """Too many requests with this API key; ``retry_after`` seconds until the next fits."""

    status_code = 429
    code = "rate_limited"


class UploadsBusy(RetryLater):
    """This API process already parses its maximum of uploads at once, or this principal its
    own maximum (503); retry after ``retry_after`` seconds."""

    status_code = 503
    code = "uploads_busy"


class ConversionsBusy(UploadsBusy):
    """This API process already converts its maximum of release files at once (503); retry
    after ``retry_after`` seconds."""

    code = "conversions_busy"


class SummariesBusy(UploadsBusy):
    """This API process already computes its maximum of release summaries at once, or this
    key its own maximum (503); retry after ``retry_after`` seconds."""

    code = "summaries_busy"


class StoreUnavailable(RetryLater):
    """The object store did not answer (503); nothing was stored or changed: retry after
    ``retry_after`` seconds."""

    status_code = 503
    code = "store_unavailable"


class ReleaseFinished(Conflict):
    """The release already succeeded or failed: it can no longer be cancelled (409)."""

    code = "release_finished"


class NotReady(Conflict):
    """The release exists but has no artifact yet (409)."""

    code = "not_ready"
