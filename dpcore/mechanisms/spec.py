"""What a mechanism is, in one object.

A mechanism lives in one package (``dpcore/mechanisms/<name>/``) whose ``SPEC`` holds its
whole definition: its parameters (a pydantic model: each parameter defined once, with its
default, bounds and description), its accountants, its admission checks against public facts,
its release generator, its audit case and hints for evaluation, grouped by what reads them
(``Accounting``, ``Admission``, ``Execution``, ``Guidance``). The registry
(``dpcore.mechanisms.registry``) collects the specs; the API's request schema,
``GET /mechanisms``, the worker, ``dprelease account``/``audit``, evaluation and the benches
all derive from them, and ``MechanismSpec.plan`` is the one way from a request to its noise
and (ε, δ). The benchmarks' hints sit beside each mechanism (its ``bench`` module,
``dpcore.mechanisms.bench_hints``).

The spec module of a mechanism stays light: its numerics (accountant events, the torch
generator, the audit's runs) are imported on first use through ``lazy``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from dpcore.accounting.accountant import Accountant, Event, Key
from dpcore.mechanisms.contract import Generator
from dpcore.mechanisms.planning import Planned, Target
from dpcore.mechanisms.shape_rules import MIXING_DEGREE_RULE as MIXING_DEGREE_RULE
from dpcore.mechanisms.shape_rules import mixing_degree as mixing_degree
from dpcore.mechanisms.shape_rules import row_shrink as row_shrink

if TYPE_CHECKING:
    import numpy as np
    from pydantic import BaseModel

    from dpcore.accounting.events import NoiseDescription
    from dpcore.audit.case import AuditCase
    from dpcore.mechanisms.sharding import ShardSpec


# The worker pools a mechanism's jobs may run on (``Execution.queue``).
WorkerQueue = Literal["cpu", "gpu"]
WORKER_QUEUES: tuple[WorkerQueue, ...] = get_args(WorkerQueue)


class InvalidParams(ValueError):
    """A request's parameters do not fit the dataset's public facts or the server's limits."""


class ReleaseOverSizeCap(InvalidParams):
    """The release file would pass the server's size cap (``PublicFacts.max_release_bytes``).
    Its figures are public: rows from the parameters (or n), width from the declared schema."""

    def __init__(self, message: str, *, estimate: int, limit: int) -> None:
        super().__init__(message)
        self.estimate, self.limit = estimate, limit


class JobOverWorkCap(InvalidParams):
    """The job's declared work (``Admission.work``) passes the server's cap
    (``PublicFacts.max_job_work``). Its figures are public: the parameters and the shape."""

    def __init__(self, message: str, *, estimate: float, limit: float) -> None:
        super().__init__(message)
        self.estimate, self.limit = estimate, limit


class SpecError(TypeError):
    """A mechanism's spec is inconsistent (a programming error, found at registration)."""


class Cancelled(Exception):
    """The release was cancelled while its job ran: stop and draw no more noise."""


@dataclass(frozen=True)
class PublicFacts:
    """What admission may read of a dataset. ``class_counts`` is private (rows per class,
    owner-only): a check reading it must only ever answer the owner."""

    n: int
    n_features: int
    n_classes: int
    feature_shape: tuple[int, ...] = ()
    # The table's columns as declared: each categorical column's one-hot block counts once,
    # each missing-value indicator once (None: every feature is a column).
    n_columns: int | None = None
    max_release_rows: int | None = None
    # How errors name the limit (the service names its setting); default "the limit N".
    limit_hint: str | None = None
    class_counts: tuple[int, ...] | None = None
    # The size cap on a release file, in bytes, and what one written value takes in the
    # requested format; the estimate is rows × (features + classes) × value_bytes.
    max_release_bytes: int | None = None
    value_bytes: int = 4
    bytes_hint: str | None = None
    # The cap on a job's declared work (``Admission.work``, multiply-adds), and how errors
    # name it; None: no cap.
    max_job_work: float | None = None
    work_hint: str | None = None

    def keys(self) -> dict[str, int]:
        """The facts an accountant may declare as keys (it takes those it declares)."""
        return {
            "n": self.n,
            "d_x": self.n_features,
            "n_features": self.n_features,
            "d_y": self.n_classes,
            "n_classes": self.n_classes,
            "n_columns": self.n_features if self.n_columns is None else self.n_columns,
        }

    def check_rows(self, rows: int, what: str = "n_samples") -> None:
        if self.max_release_rows is not None and rows > self.max_release_rows:
            limit = self.limit_hint or f"the limit {self.max_release_rows}"
            raise InvalidParams(f"{what} {rows} exceeds {limit}")
        estimate = self.release_bytes(rows)
        if self.max_release_bytes is not None and estimate > self.max_release_bytes:
            limit = self.bytes_hint or f"the limit of {self.max_release_bytes} bytes"
            raise ReleaseOverSizeCap(
                f"{what} {rows} makes a release file of about {estimate} bytes ({rows} rows × "
                f"({self.n_features} features + {self.n_classes} classes) × {self.value_bytes} "
                f"bytes per value), more than {limit}: ask for fewer rows",
                estimate=estimate,
                limit=self.max_release_bytes,
            )

    def check_work(self, estimate: float) -> None:
        """Refuse (``JobOverWorkCap``) a job whose declared work passes the cap."""
        if self.max_job_work is not None and not estimate <= self.max_job_work:
            limit = self.work_hint or f"the limit of {self.max_job_work:.3g}"
            raise JobOverWorkCap(
                f"this job's estimated work, {estimate:.3g} multiply-adds (from its parameters "
                f"and the dataset's public shape), is more than {limit}: lower the "
                "parameters that repeat the work (epochs, steps, iterations, rows) or the "
                "model's size",
                estimate=estimate,
                limit=self.max_job_work,
            )

    def default_rows(self, multiple: int = 1) -> int:
        """The rows a release makes when the request names none: n, lowered to the server's
        row and byte caps, rounded down to a multiple of ``multiple`` (public figures only)."""
        rows = self.n
        if self.max_release_rows is not None:
            rows = min(rows, self.max_release_rows)
        if self.max_release_bytes is not None:
            rows = min(rows, self.max_release_bytes // max(1, self.release_bytes(1)))
        return max(multiple, rows - rows % multiple)

    def release_bytes(self, rows: int) -> int:
        """Estimated size of a release file of ``rows`` rows (public figures only)."""
        return rows * (self.n_features + self.n_classes) * self.value_bytes


# What a mechanism is for, beside what it does (``Guidance.kind``).
MechanismKind = Literal["mechanism", "baseline"]

# What a released row's label is, which fixes how a release table names and fills
# its label column(s) (``dpcore.release_layout``): "exact" — each row has one true class (a
# mixture within one class, a cluster's mean, a class-conditional sample), released as the
# class itself; "proportions" — a noisy class vector (mixed or perturbed one-hot labels),
# released as class proportions; "combinations" — signed random combinations of one-hot
# labels, released as drawn. Evaluation trains on the first two as class distributions and
# regresses the third (``MechanismSpec.soft_labels``).
LabelKind = Literal["exact", "proportions", "combinations"]
LABEL_KINDS: tuple[LabelKind, ...] = get_args(LabelKind)


@dataclass(frozen=True)
class FeatureNoise:
    """The noise a released feature value carries, read per column (preview's signal-to-noise),
    from public figures only: ``unit_std`` per feature position, on the unit
    scale (the column's declared range [lo, hi] mapped to [0, 1]), or None where the released
    values carry no per-value noise that public figures fix (``meaning`` says why);
    ``max_shrink``: the largest factor by which the preprocessing's row-norm bound may have
    scaled a record down (a row scaled down by s carries, relative to its own raw values, s
    times the noise); ``meaning``: what a released value is, in words."""

    # One value per feature position (an array: a preview of a wide dataset must not build
    # one Python object per feature).
    unit_std: np.ndarray | None
    max_shrink: float
    meaning: str


FeatureNoiseOf = Callable[[Any, PublicFacts, "NoiseDescription"], FeatureNoise]
#: A mechanism's own preview warnings for a request (its validated params, the public facts,
#: the noise as charged): [{"code", "message"}], public figures only.
WarningsOf = Callable[[Any, PublicFacts, "NoiseDescription"], list[dict[str, str]]]


@dataclass(frozen=True)
class ShapeDefault:
    """A parameter whose good value depends on the dataset's public shape (n, d, classes,
    the server's caps): a request may leave it out (or null), and admission fills it in with
    ``value(params so far, facts)`` — public figures only — before the checks, the accountant
    and the stored parameters see it. ``rule`` says it in words for the schema's description.
    Resolved in the order the spec lists them (a later one may read an earlier one's value).
    ``per_row``: the value is a count of released rows that scales with n (a recommendation
    measured at n' keeps its ratio to n, ``dpcore.mechanisms.recommend``)."""

    name: str
    rule: str
    value: Callable[[Mapping[str, Any], PublicFacts], Any]
    per_row: bool = False


Check = Callable[[Any, PublicFacts], None]

#: Per noise scale (its name in the accountant's description), an upper bound on how many
#: values one draw of it spans (the last axis of a sampler call), from public figures only.
#: Scales left out draw rows no wider than a released record (features plus classes).
NoiseWidths = Callable[[Any, PublicFacts], Mapping[str, int]]

#: A job's work, declared: an upper bound on its arithmetic in multiply-adds (the order of its
#: time on one worker), from public figures only (parameters, the dataset's shape), so that
#: admission bounds a job's time before it is queued.
WorkOf = Callable[[Any, PublicFacts], float]

#: The neighbour relation every ε the service reports holds for, unless a mechanism's
#: parameters opt in to a narrower one (``Accounting.relation``).
REPLACE_ONE = "replace-one (n public)"

# A mechanism's neighbour relation for a release's stored parameters (a JSON object: releases
# and ledger entries written before a parameter existed lack it), in words; None: replace-one.
Relation = Callable[[Mapping[str, Any]], str | None]


def rows_default(name: str = "n_samples", per_class: bool = False) -> ShapeDefault:
    """``name`` defaults to n rows, lowered to the server's row and byte caps (a multiple of
    the number of classes when ``per_class``: the mechanism splits rows evenly over them)."""
    rule = "n (the dataset's rows), lowered to the server's caps on release rows and bytes"
    if per_class:
        rule += ", rounded down to a multiple of the number of classes"
    return ShapeDefault(
        name,
        rule,
        lambda values, facts: facts.default_rows(facts.n_classes if per_class else 1),
        per_row=True,
    )


def soft_labels(kind: str) -> bool:
    """Whether labels of ``kind`` are trained on as class distributions (else regressed)."""
    return kind != "combinations"


PreprocessTest = Callable[[Mapping[str, Any], Mapping[str, Any], Any], Any]


def _no_check(params: Any, facts: PublicFacts) -> None:
    return None


@dataclass(frozen=True)
class EvaluationHints:
    """How evaluation reads a release. ``preprocess_test(metadata, extra, X_raw)`` maps real
    records into the release's feature space with public facts only (None: the unit-scale
    preprocessing of ``dpcore.preprocessing.unit_features``); ``image_features``: features
    keep the data's image shape. How to train on the labels follows from the mechanism's
    ``label_kind`` (``MechanismSpec.soft_labels``)."""

    preprocess_test: PreprocessTest | None = None
    image_features: bool = True


@dataclass(frozen=True)
class AuditSpec:
    """The empirical audit: its keys (with the audit's own small defaults) and the case,
    loaded on first use."""

    keys: tuple[Key, ...]
    case: Callable[[], AuditCase]


@dataclass(frozen=True)
class Accounting:
    """How a release is accounted. ``accountants``: its analyses, ``default`` the one a
    request gets when it names none. ``release_only``: parameters only the generator reads;
    every other parameter must reach each accountant (as a key, or as a value the accountant's
    analysis assumes). ``relation``: where some parameter values narrow the neighbour relation
    below replace-one (an assumption on both neighbours, e.g. DP-CDA's declared class sizes),
    the relation those values give, stated on the release, its metadata and its ledger entry."""

    accountants: tuple[Accountant, ...]
    default: str = "tight"
    release_only: frozenset[str] = frozenset()
    relation: Relation | None = None

    def validate(self, mechanism: str, fields: set[str]) -> None:
        unknown = self.release_only - fields
        if unknown:
            raise SpecError(f"{mechanism}: release_only names unknown parameters {unknown}")
        names = [a.name for a in self.accountants]
        if len(set(names)) != len(names):
            raise SpecError(f"{mechanism}: accountant names repeat: {names}")
        if self.default not in names:
            raise SpecError(f"{mechanism}: default accountant {self.default!r} missing")
        for accountant in self.accountants:
            if accountant.mechanism != mechanism:
                raise SpecError(
                    f"{mechanism}: accountant {accountant.name} is {accountant.mechanism}'s"
                )
            bad = set(accountant.assumes) - fields
            if bad:
                raise SpecError(f"{mechanism}/{accountant.name} assumes unknown parameters {bad}")
            dropped = fields - accountant.key_names - self.release_only - set(accountant.assumes)
            if dropped:
                raise SpecError(
                    f"{mechanism}: parameter(s) {sorted(dropped)} reach neither the "
                    f"{accountant.name} accountant (as keys or assumed values) nor release_only"
                )


@dataclass(frozen=True)
class Admission:
    """What admission does with a request's parameters: ``shape_defaults`` fill in those left
    out from the dataset's public shape (``ShapeDefault``), then ``check`` refuses values that
    do not fit its public facts or the server's limits. ``title``: the name of the generated
    API request schema (e.g. "MixingRequest"). ``work``: the job's declared work
    (``WorkOf``), held to the server's cap (``PublicFacts.check_work``); None: uncapped.
    ``noise_widths``: how wide the job's noise draws are (``NoiseWidths``), so that admission
    refuses a noise the secure sampler could not draw instead of the job failing after it
    read the data (None: row-wide draws)."""

    check: Check = _no_check
    shape_defaults: tuple[ShapeDefault, ...] = ()
    title: str = ""
    noise_widths: NoiseWidths | None = None
    work: WorkOf | None = None

    def validate(self, mechanism: str, fields: set[str]) -> None:
        shaped = [d.name for d in self.shape_defaults]
        if set(shaped) - fields or len(set(shaped)) != len(shaped):
            raise SpecError(f"{mechanism}: shape defaults name unknown or repeated fields {shaped}")


@dataclass(frozen=True)
class Execution:
    """How a release job runs.

    ``release``: the generator; None: accounting only (``dprelease account`` knows it; the
    service does not run it). ``queue``: the worker pool that runs its jobs, "cpu" (the
    default) or "gpu" (heavy training jobs, e.g. DPGM, run by workers that hold a GPU); each
    pool is a Celery queue (DPRELEASE_CPU_QUEUE, DPRELEASE_GPU_QUEUE), CPU-only deployments
    simply run a worker on both, and embedded mode runs every job in-process and ignores it.
    ``distributed``: how the mechanism runs as a map–reduce job (docs/scaling.md), a builder
    (params, the dataset's public declarations, the declared noise) → a
    ``dpcore.distributed.jobs`` job raising ``Unsupported`` for options it lacks, loaded lazily
    like ``release``; None: one machine only. ``shard``: how a release splits into
    independently drawn shards run by several workers (``dpcore.mechanisms.sharding``); None:
    it always runs whole."""

    release: Generator | None = None
    queue: WorkerQueue = "cpu"
    distributed: Callable[[Any, Any, NoiseDescription], Any] | None = None
    shard: ShardSpec | None = None

    def validate(self, mechanism: str, fields: set[str]) -> None:
        if self.queue not in WORKER_QUEUES:
            raise SpecError(f"{mechanism}: queue {self.queue!r} is not one of {WORKER_QUEUES}")
        if self.shard is not None and self.shard.rows_param not in fields:
            raise SpecError(f"{mechanism}: shard counts rows by unknown {self.shard.rows_param!r}")


@dataclass(frozen=True)
class Guidance:
    """What someone choosing a mechanism reads (GET /mechanisms, a release's metadata, the
    preview). ``summary``; ``output``: what a release holds, in words; ``kind``: a baseline is
    a comparison point (published beside the mechanisms to measure them against), not a
    recommended choice; ``good_for``: one sentence, the data and uses it suits, from the
    measured results; ``reference``: the paper it implements; ``feature_noise``: the noise on
    released feature values, per column (the preview's signal-to-noise; ``FeatureNoise``),
    None where the mechanism declares none; ``warnings``: what the preview should tell the
    owner about a request before it is charged (``WarningsOf``); ``essentials``: the few
    parameters an owner is likely to set (forms show them first, the rest as advanced)."""

    summary: str
    output: str
    kind: MechanismKind = "mechanism"
    good_for: str = ""
    reference: str = ""
    feature_noise: FeatureNoiseOf | None = None
    warnings: WarningsOf | None = None
    essentials: tuple[str, ...] = ()

    def validate(self, mechanism: str, fields: set[str] | None = None) -> None:
        if self.kind not in ("mechanism", "baseline"):
            raise SpecError(f"{mechanism}: kind {self.kind!r} is not mechanism or baseline")
        unknown = [name for name in self.essentials if fields is not None and name not in fields]
        if unknown:
            raise SpecError(f"{mechanism}: essentials {unknown} are not parameters")


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    params: type[BaseModel]
    # What a released row's label is (``LabelKind``): declared by every mechanism, since it
    # fixes the release table's label columns.
    label_kind: LabelKind
    accounting: Accounting
    guidance: Guidance
    admission: Admission = Admission()
    execution: Execution = Execution()
    audit: AuditSpec | None = None
    evaluation: EvaluationHints = EvaluationHints()

    @property
    def served(self) -> bool:
        return self.execution.release is not None

    @property
    def soft_labels(self) -> bool:
        """Labels are class distributions to train on as such (exact classes, noisy class
        vectors), rather than signed combinations to regress."""
        return soft_labels(self.label_kind)

    @cached_property
    def request_params(self) -> type[BaseModel]:
        """The ``params`` model of the API's request: ``params`` with every shape default made
        optional (null or absent: filled in at admission by ``resolve``), its rule appended to
        the field's description. The same name, so the schema keeps its component names."""
        if not self.admission.shape_defaults:
            return self.params
        from pydantic import Field, create_model

        fields: dict[str, Any] = {}
        for default in self.admission.shape_defaults:
            info = self.params.model_fields[default.name]
            inner: Any = (
                Annotated.__class_getitem__((info.annotation, *info.metadata))  # type: ignore[attr-defined]
                if info.metadata
                else info.annotation
            )
            described = f"{(info.description or '').rstrip('.')}. Default: {default.rule}"
            fields[default.name] = (inner | None, Field(default=None, description=described))
        model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            self.params.__name__,
            __base__=self.params,
            __module__=self.params.__module__,
            __doc__=self.params.__doc__,
            **fields,
        )
        return model

    def neighbours(self, params: Mapping[str, Any]) -> str:
        """The neighbour relation a release of these (stored) parameters is DP for."""
        relation = self.accounting.relation
        narrower = relation(params) if relation is not None else None
        return narrower or REPLACE_ONE

    def resolve(self, params: BaseModel, facts: PublicFacts) -> BaseModel:
        """``params`` (of ``request_params``) with every shape default filled in from the
        public ``facts``, validated by ``params``: the parameters the checks, the accountant,
        the worker and the stored release see."""
        values = params.model_dump()
        for default in self.admission.shape_defaults:
            if values.get(default.name) is None:
                values[default.name] = default.value(values, facts)
        return self.params.model_validate(values)

    def check(self, params: BaseModel, facts: PublicFacts) -> None:
        """Admission's checks of resolved ``params`` against the public ``facts``
        (``InvalidParams`` where they do not fit), then its declared work against the cap."""
        self.admission.check(params, facts)
        work = self.work(params, facts)
        if work is not None:
            facts.check_work(work)

    def work(self, params: BaseModel, facts: PublicFacts) -> float | None:
        """The job's declared work (``Admission.work``) for resolved ``params`` on the public
        ``facts``; None when the spec declares none."""
        if self.admission.work is None:
            return None
        return float(self.admission.work(params, facts))

    def check_sampler(
        self, params: BaseModel, facts: PublicFacts, noise: NoiseDescription, sampler: str
    ) -> None:
        """Refuse (``InvalidParams``) a noise the named sampler could not draw in the job:
        the secure sampler's lattice has a largest scale, which a large σ over wide rows
        passes. Public figures only (σ, the declared widths)."""
        if sampler != "secure":
            return
        from dpcore.mechanisms.noise import check_drawable

        widths = self.admission.noise_widths
        declared = widths(params, facts) if widths is not None else {}
        row = facts.n_features + facts.n_classes
        for scale in noise.scales:
            width = int(declared.get(scale.name, row))
            try:
                check_drawable(sigma=scale.sigma, sensitivity=scale.sensitivity, width=width)
            except ValueError as exc:
                raise InvalidParams(
                    f"noise {scale.name!r} (σ = {scale.sigma:g} over up to {width} values per "
                    f"draw) is beyond what the secure sampler draws: ask for less noise (a "
                    f"larger ε), or noise_sampler 'fast'"
                ) from exc

    def accountant(self, name: str) -> Accountant:
        for accountant in self.accounting.accountants:
            if accountant.name == name:
                return accountant
        names = ", ".join(a.name for a in self.accounting.accountants)
        raise ValueError(f"no accountant {self.name}/{name}; {self.name} has: {names}")

    def validate(self) -> None:
        """Refuse a spec where a parameter could be silently dropped on its way to an
        accountant, or whose accountants belong to another mechanism, or whose groups name
        what it lacks."""
        if not self.name.isidentifier():
            raise SpecError(f"mechanism name {self.name!r} must be an identifier")
        fields = set(self.params.model_fields)
        self.execution.validate(self.name, fields)
        self.admission.validate(self.name, fields)
        if self.label_kind not in LABEL_KINDS:
            raise SpecError(
                f"{self.name}: label_kind {self.label_kind!r} is not one of {LABEL_KINDS}"
            )
        self.guidance.validate(self.name, fields)
        self.accounting.validate(self.name, fields)
        if self.audit is not None:
            audit_names = [k.name for k in self.audit.keys]
            if len(set(audit_names)) != len(audit_names):
                raise SpecError(f"{self.name}: audit keys repeat: {audit_names}")

    def event_at(self, target: Target, params: BaseModel, facts: PublicFacts) -> Event:
        """The event of a release of resolved (or stored) ``params`` on ``facts`` at
        ``target``: calibrated to its ε, or at its σ. No admission: ``plan`` runs it first."""
        accountant = self.accountant(target.accountant)
        return target.event(
            accountant, self.accountant_keys(accountant, params, facts, target.request_keys)
        )

    def plan(
        self,
        params: BaseModel,
        facts: PublicFacts,
        target: Target,
        *,
        admit: Callable[[Accountant], None] | None = None,
        sampler: str | None = None,
    ) -> Planned:
        """A release of ``params`` (of ``request_params``) on the public ``facts`` at
        ``target``: shape defaults filled in, admission's checks, the target's accountant
        (``admit``: the caller's own policy on it, run before any accounting), its event at
        the calibrated or given noise, and the (ε, δ) it costs at the target's δ. ``sampler``:
        the release's noise sampler, whose limits the noise must fit (``check_sampler``)."""
        resolved = self.resolve(params, facts)
        self.check(resolved, facts)
        accountant = self.accountant(target.accountant)
        if admit is not None:
            admit(accountant)
        event = self.event_at(target, resolved, facts)
        if sampler is not None:
            self.check_sampler(resolved, facts, event.noise(), sampler)
        return Planned(
            resolved,
            accountant,
            event,
            event.cost(target.delta_for(event)),
            work=self.work(resolved, facts),
        )

    def accountant_keys(
        self,
        accountant: Accountant,
        params: BaseModel,
        facts: PublicFacts,
        request_keys: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The keys ``accountant`` gets for a release of these params on these facts. Facts
        are offered (the accountant takes the ones it declares); every parameter must reach
        it; request keys (``sigma_y``, ``noise_ratio``) must be declared."""
        declared = accountant.key_names
        keys: dict[str, Any] = {k: v for k, v in facts.keys().items() if k in declared}
        for name, value in params.model_dump().items():
            if name in declared:
                keys[name] = value
            elif name in accountant.assumes:
                if value != accountant.assumes[name]:
                    raise InvalidParams(
                        f"the {accountant.name} accountant of {self.name} analyses "
                        f"{name}={accountant.assumes[name]!r} only, not {value!r}"
                    )
            elif name not in self.accounting.release_only:
                raise SpecError(f"{self.name}: parameter {name} reaches no accountant")
        for name, value in (request_keys or {}).items():
            if name not in declared:
                raise InvalidParams(f"'{name}' does not apply to {self.name}/{accountant.name}")
            keys[name] = value
        return keys
