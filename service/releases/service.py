"""Planning (calibration), admission and reading of releases."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import quote

from sqlalchemy.orm import Session

from dpcore.accounting.accountant import Accountant, Event
from dpcore.accounting.composition import Cost
from dpcore.accounting.filter import Spend
from dpcore.calibration import CalibrationError
from dpcore.mechanisms import registry
from dpcore.mechanisms.planning import DeltaRule, Target
from dpcore.mechanisms.spec import (
    REPLACE_ONE,
    InvalidParams,
    JobOverWorkCap,
    MechanismSpec,
    ReleaseOverSizeCap,
)
from service import owner_only
from service.access import (
    dataset_for,
    granted_dataset_ids,
    may_see,
    release_for,
    require_active,
)
from service.audit_trail import service as audit
from service.budgets import repository as budget_repository
from service.budgets import service as budget_service
from service.config import Settings
from service.db import after_commit
from service.errors import (
    BudgetExceeded,
    ClassesUndeclared,
    InvalidInput,
    JobTooLong,
    NotFound,
    ReleaseTooLarge,
)
from service.models import Dataset, DatasetBudget, Principal, Release
from service.releases import guidance, lifecycle, repository
from service.releases import noise as release_noise
from service.releases import research as research_releases
from service.releases.mechanisms import facts, route
from service.releases.schemas import (
    Artifact,
    Charge,
    ExtraArtifactOut,
    Noise,
    PreviewOut,
    PreviewWarning,
    ReleaseList,
    ReleaseOut,
    ReleaseRequestBase,
    Settlement,
    Timings,
)
from service.releases.status import ReleaseStatus
from service.runtime import Dispatcher


@dataclass(frozen=True)
class Plan:
    dataset: Dataset
    event: Event
    cost: Cost
    params: dict[str, Any]
    sampler: str
    mechanism: str
    # A research release's claim (``research.claim``): it charges nothing.
    research: dict[str, Any] | None = None
    # The held-out dataset of the owner-only report (``report_test_dataset_id``), checked.
    report_dataset: Dataset | None = None
    work: float | None = None  # declared (``Planned.work``): stored, it picks the lane

    @property
    def noise(self) -> Noise:
        return release_noise.from_description(self.event.noise(), self.sampler)

    @property
    def neighbour_relation(self) -> str:
        return registry.get(self.mechanism).neighbours(self.params)

    @property
    def description(self) -> dict[str, Any]:
        """The ledger entry's description: the accountant's, and the neighbour relation its
        ε holds for."""
        return {**self.event.describe(), "neighbour_relation": self.neighbour_relation}

    @property
    def charge(self) -> Charge:
        if self.research is not None:
            return RESEARCH_CHARGE
        return Charge(epsilon=self.cost.epsilon, delta=self.cost.delta)


# What a research release costs the budget: nothing (it is shown to the owner only).
RESEARCH_CHARGE = Charge(
    epsilon=0.0, delta=0.0, charged_as="research", consumed_epsilon=0.0, consumed_delta=0.0
)


def label_noise(request: ReleaseRequestBase) -> dict[str, Any]:
    """The request's label-noise choices: accountant keys of their own (``Target``)."""
    asked: dict[str, Any] = {}
    if request.noise is not None and request.noise.sigma_y is not None:
        asked["sigma_y"] = request.noise.sigma_y
    if request.noise_ratio is not None:
        asked["noise_ratio"] = request.noise_ratio
    return asked


def admit_accountant(
    spec: MechanismSpec, accountant: Accountant, request: ReleaseRequestBase
) -> None:
    """The service's policy on a request's accountant, before any accounting: research
    releases (owner-only opt-in), and label noise only where the mechanism has its own."""
    research_releases.check(spec, accountant, request.research)
    for name in label_noise(request):
        if name not in accountant.key_names:
            raise InvalidInput(
                f"{spec.name} has no separate label noise: "
                f"'{'noise.sigma_y' if name == 'sigma_y' else name}' does not apply"
            )


# Relative margin below the δ left of a default δ share, so that shares whose ε add up to what
# is left have δ's whose floating-point sum does not pass it.
_SHARE_MARGIN = 1e-9
# The smallest share of the δ left a default δ takes: a release whose ε is ~0 (a huge given
# noise) still needs a δ in (0, 1), and a geometric sequence of such shares never empties it.
MIN_DEFAULT_DELTA_SHARE = 1e-6


def default_delta(budget: DatasetBudget, spent: Spend, epsilon: float) -> float:
    """A release's δ when the request gives none: the δ left in proportion to the share of
    the ε left it asks for, δ_left·min(1, ε/ε_left) (at least ``MIN_DEFAULT_DELTA_SHARE`` of
    it). Only a release asking for the whole ε left gets the whole δ left, so defaults never
    make δ the binding constraint before ε (docs/privacy.md, "Default δ"): with ``basic``
    charges this is the budget's δ share δ_B·ε/ε_B, and where δ was spent faster (an explicit
    δ, a Rényi group's δ_R) later defaults shrink with what is left instead of taking it all.
    With no δ left (only a Rényi group or pure ε-DP can still be admitted) it is the budget's
    δ share, the release's own guarantee's δ."""
    left = spent.delta_left
    epsilon_left = budget.epsilon - spent.epsilon
    if left <= 0:
        left, epsilon_left = budget.delta, budget.epsilon
    if epsilon_left <= 0 or epsilon >= epsilon_left:
        return left
    share = max(MIN_DEFAULT_DELTA_SHARE, epsilon / epsilon_left)
    return left * share * (1 - _SHARE_MARGIN)


def target(request: ReleaseRequestBase, budget: DatasetBudget, spent: Spend) -> Target:
    """What a request aims at: its ε, just under it so the charge, rounded up, still meets it,
    at its δ or a default share of the δ left; or its noise, at its δ or the share its ε at
    the δ left takes (at most the ε it is charged: a smaller δ only raises ε, so the share
    errs towards spending less δ)."""
    asked = label_noise(request)
    if request.epsilon is not None:
        return Target(
            request.accountant,
            epsilon=request.epsilon / (1 + 2 * budget_service.ROUNDING_SLACK),
            delta=request.delta or default_delta(budget, spent, request.epsilon),
            request_keys=asked,
        )
    assert request.noise is not None
    share: float | DeltaRule = request.delta or (
        lambda event: default_delta(budget, spent, event.epsilon(spent.delta_left or budget.delta))
    )
    return Target(request.accountant, sigma=request.noise.sigma_x, delta=share, request_keys=asked)


def plan(
    session: Session, *, principal: Principal, request: ReleaseRequestBase, settings: Settings
) -> Plan:
    """Calibrate (or cost) a request with the accountant the CLI uses too, and run every
    check admission runs before the ledger's budget test: preview and create both plan, so a
    request preview accepts is refused by create only for the budget (or a race)."""
    dataset = dataset_for(session, principal=principal, dataset_id=request.dataset_id, manage=True)
    require_active(dataset)
    require_declared_classes(dataset)
    budget = budget_repository.get_budget(session, dataset_id=dataset.id)
    if budget is None:
        raise NotFound(f"dataset {dataset.id} not found")
    if request.delta is not None and request.delta > budget.delta:
        raise InvalidInput(
            f"delta {request.delta:g} is larger than the dataset's budget delta {budget.delta:g}"
        )
    spent = budget_service.spend_of(session, budget=budget)
    spec = registry.get(request.mechanism)
    try:
        # Parameters left out take their defaults from the public shape.
        planned = spec.plan(
            request.params,
            facts(dataset, settings, request.format),
            target(request, budget, spent),
            admit=lambda accountant: admit_accountant(spec, accountant, request),
            sampler=request.noise_sampler,
        )
    except ReleaseOverSizeCap as exc:
        raise ReleaseTooLarge(
            str(exc), detail={"estimated_bytes": exc.estimate, "limit_bytes": exc.limit}
        ) from exc
    except JobOverWorkCap as exc:
        raise JobTooLong(
            str(exc), detail={"estimated_work": exc.estimate, "limit_work": exc.limit}
        ) from exc
    except (CalibrationError, InvalidParams, ValueError) as exc:
        if not raised_by_us(exc):
            # A library's text (numpy, scipy, dp-accounting) is not the service's answer.
            raise InvalidInput(
                "these parameters cannot be accounted for: the accountant's numerics refused "
                "them; try a noise or ε nearer the usual range"
            ) from exc
        raise InvalidInput(str(exc)) from exc
    except ArithmeticError as exc:
        # Numbers at the edge of floating point (a noise of 5e-324, whose square is 0) break
        # the accountant's arithmetic: refused, as nothing can be accounted for them.
        raise InvalidInput(
            "these numbers are out of the range the accountant can evaluate"
        ) from exc
    if not math.isfinite(planned.epsilon):
        raise InvalidInput("this noise gives no finite ε at the requested δ; add noise")
    cost = replace(planned.cost, epsilon=budget_service.round_up(planned.epsilon))
    if not request.research:
        # The ledger's own guard (``admit`` runs it again under the lock).
        budget_service.check_amount(cost, budget)
    report_dataset = None
    if request.report_test_dataset_id is not None:
        report_dataset = _report_dataset(
            session, principal, dataset, request.report_test_dataset_id
        )
    return Plan(
        dataset=dataset,
        event=planned.event,
        cost=cost,
        # With the analysis parameters the accountant fixed (``Planned.stored_params``).
        params=planned.stored_params(),
        sampler=request.noise_sampler,
        mechanism=request.mechanism,
        research=research_releases.claim(
            spec, planned.accountant, epsilon=cost.epsilon, delta=cost.delta
        )
        if request.research
        else None,
        report_dataset=report_dataset,
        work=planned.work,
    )


# The packages whose exception texts are the service's own wording.
_OWN_PACKAGES = ("dpcore", "service")


def raised_by_us(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by the service's own code (its text is ours to show), not
    by a library it called (whose text names internals)."""
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in _OWN_PACKAGES


def require_declared_classes(dataset: Dataset) -> None:
    """Every served mechanism publishes labels: one column per class, named after it, in
    every release file and its metadata, and the number of classes sizes its rows. Undeclared,
    the classes are the labels found in the private data (a rare label is a record's value),
    so such a dataset takes no release until it is uploaded again with ``classes``."""
    if not dataset.classes_declared:
        raise ClassesUndeclared(
            f"dataset {dataset.id} has no declared classes: releases publish the label set "
            "(column names, one-hot width), and the labels found in the file are private. "
            "Upload it again with `classes` in the metadata listing every class (those absent "
            "from the file too)",
            detail={"dataset_id": dataset.id},
        )


def preview(
    session: Session, *, principal: Principal, request: ReleaseRequestBase, settings: Settings
) -> PreviewOut:
    p = plan(session, principal=principal, request=request, settings=settings)
    if p.research is not None:
        # Charged nothing: the budget as it is, and the claim instead of a charge.
        budget = budget_service.preview_free(session, dataset_id=p.dataset.id)
        charge = p.charge
        warnings: list[dict[str, str]] = []  # charged nothing: the budget's δ is untouched
    else:
        budget = budget_service.preview(session, dataset_id=p.dataset.id, cost=p.cost)
        warnings = budget_service.delta_warnings(
            budget["epsilon"], budget["delta"], budget, ratio=settings.delta_warning_ratio
        )
        charge = p.charge.model_copy(
            update={
                "charged_as": budget["charged_as"],
                "consumed_epsilon": None
                if budget["total_after"] is None
                else max(0.0, budget["total_after"] - budget["reserved"]),
                "consumed_delta": max(0.0, budget["delta_after"] - budget["delta_reserved"]),
            }
        )
    public = facts(p.dataset, settings, request.format)
    warnings += guidance.shape_warnings(p.dataset)
    spec, noise = registry.get(request.mechanism), p.event.noise()
    warnings += guidance.mechanism_warnings(spec, p.params, public, noise)
    guide = guidance.noise_guide(
        spec,
        p.params,
        public,
        noise,
        p.dataset,
        settings.preview_noise_columns,
    )
    warnings += guidance.noise_warnings(guide, p.dataset.n_features)
    return PreviewOut(
        noise_guide=guide,
        # At the (ε, δ) this release is charged (or, for a given noise, reaches): public.
        recommended=guidance.recommendations(public, p.cost.epsilon, p.cost.delta),
        dataset_id=p.dataset.id,
        mechanism=request.mechanism,
        params=p.params,
        accountant=request.accountant,
        noise=p.noise,
        charge=charge,
        neighbour_relation=p.neighbour_relation,
        budget=budget,  # type: ignore[arg-type]
        research=research_releases.out(p.research),
        warnings=[PreviewWarning(**w) for w in warnings],  # type: ignore[arg-type]
    )


def create(
    session: Session,
    *,
    principal: Principal,
    request: ReleaseRequestBase,
    settings: Settings,
    dispatcher: Dispatcher,
) -> Release:
    p = plan(session, principal=principal, request=request, settings=settings)
    used = [p.dataset] if p.report_dataset is None else [p.dataset, p.report_dataset]
    # Deletion locks the same budget rows: once we hold them, a dataset still active stays
    # active (its raw data too) until this release is queued, and a queued release blocks
    # deletion. The refresh reads what a deletion that held the lock before us committed.
    budget_repository.lock_budgets(session, dataset_ids=[d.id for d in used])
    for dataset in used:
        session.refresh(dataset)
        require_active(dataset)
    report_id = used[1].id if len(used) > 1 else None
    release = repository.add(
        session,
        Release(
            dataset_id=p.dataset.id,
            requested_by=principal.id,
            mechanism=request.mechanism,
            params=p.params,
            accountant=request.accountant,
            format=request.format,
            noise=p.event.noise().to_json(),
            noise_sampler=request.noise_sampler,
            epsilon=p.charge.epsilon,
            delta=p.charge.delta,
            work=p.work,
            status=ReleaseStatus.queued,
            report_dataset_id=report_id,
            research=p.research,
        ),
    )
    charge = {"epsilon": p.charge.epsilon, "delta": p.charge.delta}
    try:
        if p.research is not None:
            entry = budget_service.record_research(
                session,
                dataset_id=p.dataset.id,
                release_id=release.id,
                mechanism=request.mechanism,
                params=p.params,
                description={**p.description, "research": p.research},
            )
        else:
            entry = budget_service.admit(
                session,
                dataset_id=p.dataset.id,
                release_id=release.id,
                mechanism=request.mechanism,
                params=p.params,
                description=p.description,
                cost=p.cost,
            )
    except BudgetExceeded:
        audit.record_despite_rollback(
            session,
            actor=principal.id,
            action="release.refused",
            object_type="dataset",
            object_id=p.dataset.id,
            detail={"mechanism": request.mechanism, "requested": charge, "reason": "budget"},
        )
        raise
    release_id, where = release.id, route(request.mechanism, p.work, settings)  # pool, lane
    after_commit(session, lambda: dispatcher.enqueue(release_id, where))
    if p.research is not None:
        # Shown to its owner only: no audit event (the trail is read by admins), no request
        # timing, no log line (``service.owner_only``).
        owner_only.mark()
        return release
    audit.record(
        session,
        actor=principal.id,
        action="release.admitted",
        object_type="release",
        object_id=release.id,
        detail={
            "dataset_id": p.dataset.id,
            "mechanism": request.mechanism,
            "accountant": request.accountant,
            "format": request.format,
            "reserved": {
                **charge,
                "charged_as": entry.charged_as,
                "consumed_epsilon": entry.consumed_epsilon,
                "consumed_delta": entry.consumed_delta,
            },
        },
    )
    return release


def _report_dataset(
    session: Session, principal: Principal, dataset: Dataset, test_id: str
) -> Dataset:
    test = dataset_for(session, principal=principal, dataset_id=test_id, manage=True)
    require_active(test)
    if test.id == dataset.id:
        raise InvalidInput("the report's test dataset must be held out: not the released one")
    if test.n_features != dataset.n_features or [str(c) for c in test.classes] != [
        str(c) for c in dataset.classes
    ]:
        raise InvalidInput(
            "the report's test dataset needs the same features and classes as the dataset"
        )
    return test


def report_erased(session: Session, release: Release) -> bool:
    if release.report_dataset_id is None:
        return False
    test = session.get(Dataset, release.report_dataset_id)
    return test is None or test.deleted_at is not None


def get(session: Session, *, principal: Principal, release_id: str) -> Release:
    return release_for(session, principal=principal, release_id=release_id)


def cancel(session: Session, *, principal: Principal, release_id: str) -> Release:
    """Cancel a release of one of the caller's datasets (``lifecycle.cancel``)."""
    release_for(session, principal=principal, release_id=release_id, manage=True)
    return lifecycle.cancel(session, release_id, actor=principal.id)


def list_visible(session: Session, *, principal: Principal, dataset_id: str | None) -> ReleaseList:
    if dataset_id is not None:
        dataset_for(session, principal=principal, dataset_id=dataset_id)
        ids: list[str] | None = [dataset_id]
    elif principal.role == "admin":
        ids = None
    elif principal.role == "owner":
        ids = [d.id for d in budget_repository.visible_datasets(session, owner_id=principal.id)]
    else:
        ids = granted_dataset_ids(session, principal_id=principal.id)
    releases = repository.list_for(session, dataset_ids=ids)
    visible = [r for r in releases if may_see(r, principal)]
    # A listing that holds a research release (its owner's) leaves no trace for the operator.
    owner_only.mark(any(r.research is not None for r in visible))
    return ReleaseList(items=[to_out(r, viewer=principal) for r in visible])


def is_owner(release: Release, viewer: Principal) -> bool:
    """Whether ``viewer`` owns the release's dataset (only an owner may request releases)."""
    return viewer.id == release.requested_by


# What anyone but the owner sees in place of a failed job's error text (it may quote raw data).
HIDDEN_ERROR = "failed"


def neighbour_relation(mechanism: str, params: dict[str, Any]) -> str:
    """The relation a release's ε holds for, from its stored parameters (replace-one unless
    they opt in to a narrower one); replace-one for a mechanism no longer registered."""
    try:
        spec = registry.get(mechanism)
    except ValueError:
        return REPLACE_ONE
    return spec.neighbours(params)


def _charge(release: Release) -> Charge:
    if release.research is not None:
        return RESEARCH_CHARGE
    entry = release.ledger_entry
    if entry is None:
        return Charge(epsilon=release.epsilon, delta=release.delta)
    consumed_epsilon, consumed_delta = budget_service.consumed_of(entry)
    return Charge(
        epsilon=release.epsilon,
        delta=release.delta,
        charged_as=entry.charged_as,
        consumed_epsilon=consumed_epsilon,
        consumed_delta=consumed_delta,
    )


def _settlement(release: Release) -> Settlement | None:
    entry = release.ledger_entry
    if release.research is not None or entry is None:
        return None
    return Settlement(state=entry.state, because=entry.settled_because)


def _if_cancelled(release: Release) -> Literal["refunded", "committed"] | None:
    """What a cancel now would do with the charge: the rule ``lifecycle.cancel`` applies, read
    from the same recorded marks."""
    if release.research is not None or release.status not in (
        ReleaseStatus.queued,
        ReleaseStatus.running,
    ):
        return None
    refunded = lifecycle.unfinished_settlement(release) == budget_service.BEFORE_PRIVATE_READ
    return "refunded" if refunded else "committed"


def to_out(release: Release, *, viewer: Principal) -> ReleaseOut:
    """Everyone but the dataset's owner (analysts and admins alike) sees that a release
    failed, not why (the error text may quote the raw data), and not when its job started or
    ended nor how long it ran."""
    owner = is_owner(release, viewer)
    artifact = None
    if release.status == ReleaseStatus.succeeded and release.artifact_sha256 is not None:
        artifact = Artifact(
            format=release.format,  # type: ignore[arg-type]
            bytes=release.artifact_bytes or 0,
            sha256=release.artifact_sha256,
        )
    extras = []
    if artifact is not None:
        extras = [
            ExtraArtifactOut(
                **record,
                download=f"/releases/{release.id}/artifacts/{quote(record['name'], safe='')}",
            )
            for record in release.artifacts or ()
        ]
    # The job's times are the owner's only: how long a computation on the private data ran
    # (its parse time grows with the raw file's size, hidden from others as ``size_bytes``).
    started_at = release.started_at if owner else None
    finished_at = release.finished_at if owner else None
    timings = Timings()
    if started_at is not None:
        timings.queued_seconds = (started_at - release.created_at).total_seconds()
        if finished_at is not None:
            timings.run_seconds = (finished_at - started_at).total_seconds()
    return ReleaseOut(
        id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        params=release.params,
        accountant=release.accountant,
        format=release.format,  # type: ignore[arg-type]
        status=release.status,
        progress=release.progress,
        phase=release.phase,
        noise=release_noise.to_out(release.noise, release.noise_sampler),
        charge=_charge(release),
        settlement=_settlement(release),
        if_cancelled=_if_cancelled(release) if owner else None,
        neighbour_relation=neighbour_relation(release.mechanism, release.params),
        error=release.error if owner or release.error is None else HIDDEN_ERROR,
        attempts=release.attempts,
        created_at=release.created_at,
        started_at=started_at,
        finished_at=finished_at,
        timings=timings,
        artifact=artifact,
        artifacts=extras,
        report=f"/releases/{release.id}/report"
        if release.report_dataset_id is not None and owner
        else None,
        research=research_releases.out(release.research),
    )
