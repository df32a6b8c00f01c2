"""The served mechanisms as the API sees them, all derived from the registry
(``dpcore.mechanisms.registry``): one request model per mechanism, the discriminated union of
them, the public facts admission checks read, the worker pool that runs each one's jobs, and
what ``GET /mechanisms`` says."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, create_model

from dpcore.categorical import column_count
from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import MechanismSpec, PublicFacts, WorkerQueue
from service.config import Settings
from service.datasets.schemas import declared_columns
from service.models import Dataset
from service.releases.schemas import (
    AccountantInfo,
    MechanismInfo,
    MechanismList,
    ReleaseRequestBase,
)
from service.runtime import Lane, Route

# Bytes one written value takes in each release format (worker.artifacts): float32 in NPZ and
# Parquet (uncompressed: noise does not compress); a float32 printed as CSV text with its
# separator stays within 16 characters.
VALUE_BYTES = {"npz": 4, "parquet": 4, "csv": 16}


def facts(dataset: Dataset, settings: Settings, fmt: str = "npz") -> PublicFacts:
    """What admission may read of ``dataset``; ``class_counts`` is owner-only (only owners
    request releases, so a check reading it answers nobody else). ``fmt`` is the release's
    file format, which sizes the file for the byte cap."""
    return PublicFacts(
        n=dataset.n_rows,
        n_features=dataset.n_features,
        n_classes=len(dataset.classes),
        feature_shape=tuple(dataset.feature_shape or ()),
        n_columns=_columns(dataset),
        max_release_rows=settings.max_release_samples,
        limit_hint=f"this server's limit {settings.max_release_samples} "
        "(DPRELEASE_MAX_RELEASE_SAMPLES)",
        class_counts=tuple(dataset.class_counts) if dataset.class_counts is not None else None,
        max_release_bytes=settings.max_release_bytes,
        value_bytes=VALUE_BYTES[fmt],
        bytes_hint=f"this server's limit of {settings.max_release_bytes} bytes "
        "(DPRELEASE_MAX_RELEASE_BYTES)",
        max_job_work=settings.max_job_work,
        work_hint=f"this server's limit of {settings.max_job_work:.3g} (DPRELEASE_MAX_JOB_WORK)",
    )


def _columns(dataset: Dataset) -> int | None:
    """The declared table's columns (``categorical.column_count``); None without ``columns``."""
    declared = declared_columns(dataset.feature_range)
    if declared is None:
        return None
    return column_count([c.model_dump(mode="json") for c in declared])


def worker_queue(mechanism: str) -> WorkerQueue:
    """The worker pool that runs ``mechanism``'s jobs (its spec's ``queue``). A mechanism no
    longer registered (a release queued before an upgrade) goes to the CPU pool, whose worker
    fails its job as any worker would."""
    try:
        return registry.get(mechanism).execution.queue
    except ValueError:
        return "cpu"


def lane(work: float | None, settings: Settings) -> Lane:
    """The lane of a job whose declared work (``Admission.work``, stored with its release) is
    ``work``: long above ``settings.long_job_work``, else short. A job without a declared
    work (a mechanism that declares none, a release admitted before the figure was stored)
    stays short, where every job waited before lanes."""
    return "long" if work is not None and work > settings.long_job_work else "short"


def route(mechanism: str, work: float | None, settings: Settings) -> Route:
    """Where a release's job waits (real mode): its mechanism's pool, and the lane its
    declared work puts it in. Its shard and finaliser tasks follow the same route."""
    return Route(worker_queue(mechanism), lane(work, settings))


_NUMBERS = (int, float)


def _fits_kind(annotation: Any, value: Any) -> bool:
    """Whether ``value`` is of the JSON kind ``annotation`` asks for, as far as numbers and
    bools go: a number field takes a number (an integer for a float is fine, a bool or a
    string is not), a bool field takes a bool; lists are checked item by item. Anything else
    (text, literals, nested objects) is left to the model's own validation."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _fits_kind(typing.get_args(annotation)[0], value)
    if origin in (typing.Union, types.UnionType):
        return any(_fits_kind(a, value) for a in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (list, tuple, Sequence):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return not isinstance(value, list) or not args or all(_fits_kind(args[0], v) for v in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation in _NUMBERS:
        return isinstance(value, _NUMBERS) and not isinstance(value, bool)
    if annotation is type(None):
        return value is None
    return True


def strict_params(model: type[BaseModel]) -> BeforeValidator:
    """The request's ``params`` read with the request's strictness: a JSON number for a
    number (never ``true`` or ``"1"``), ``true``/``false`` for a bool. At the API only: the
    parameter models stay lax for values the service stored itself (the worker reads them)."""

    def check(value: Any) -> Any:
        if isinstance(value, dict):
            for name, field in model.model_fields.items():
                if name in value and not _fits_kind(field.annotation, value[name]):
                    raise ValueError(
                        f"{name}: {json.dumps(value[name])} is not of the type the schema "
                        "gives (numbers are JSON numbers, flags true or false)"
                    )
        return value

    return BeforeValidator(check)


def request_model(spec: MechanismSpec) -> type[ReleaseRequestBase]:
    """``spec``'s request: the common fields, its ``mechanism`` literal, its ``params`` model
    (defaulted when no parameter is required) and its accountants."""
    names = tuple(a.name for a in spec.accounting.accountants)
    # The request's params: shape defaults optional, filled in at admission (``spec.resolve``).
    model = spec.request_params
    params_required = any(f.is_required() for f in model.model_fields.values())
    params_type: Any = Annotated[model, strict_params(model)]
    params: Any = (params_type, ...)
    if not params_required:
        params = (params_type, Field(default_factory=model))
    accountant_help = (
        f"The privacy analysis (default {spec.accounting.default}). GET /mechanisms describes "
        "each; one that is not a valid bound is refused for releases"
    )
    request: type[ReleaseRequestBase] = create_model(  # type: ignore[call-overload]
        spec.admission.title or f"{spec.name.title().replace('_', '')}Request",
        __base__=ReleaseRequestBase,
        __module__=__name__,
        mechanism=(Literal[spec.name], ...),  # type: ignore[arg-type,valid-type]
        params=params,
        accountant=(  # type: ignore[arg-type]
            Literal[names],  # type: ignore[valid-type]
            Field(default=spec.accounting.default, description=accountant_help),
        ),
    )
    return request


def request_union(specs: Sequence[MechanismSpec]) -> Any:
    """The body of ``POST /releases``: one of the served mechanisms' requests, told apart by
    ``mechanism``."""
    models = tuple(request_model(s) for s in specs)
    if not models:
        raise RuntimeError("no mechanism is served")
    if len(models) == 1:
        return models[0]
    return Annotated[typing.Union[models], Field(discriminator="mechanism")]  # noqa: UP007


def catalogue() -> MechanismList:
    items = []
    for spec in registry.served():
        items.append(
            MechanismInfo(
                name=spec.name,
                summary=spec.guidance.summary,
                output=spec.guidance.output,
                label_kind=spec.label_kind,
                kind=spec.guidance.kind,
                good_for=spec.guidance.good_for,
                reference=spec.guidance.reference,
                params_schema=spec.request_params.model_json_schema(),
                essential_params=list(spec.guidance.essentials),
                shardable=None if spec.execution.shard is None else spec.execution.shard.summary,
                accountants=[
                    AccountantInfo(
                        name=acc.name,
                        summary=acc.summary,
                        valid_bound=acc.valid_bound,
                        caveat=acc.caveat or None,
                        releases=acc.releases,
                    )
                    for acc in sorted(spec.accounting.accountants, key=lambda a: a.name)
                ],
            )
        )
    return MechanismList(items=items)
