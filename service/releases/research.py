"""Research releases: an accountant whose ε is not a valid bound, run under the owner's opt-in.

A paper's own analysis (``Accountant.valid_bound`` False) may not back a charge: its ε misses
data-dependent steps. An owner may still run the paper's algorithm on their own data to
reproduce its numbers, as a research release: requested with ``research: true``, shown to the
dataset's owner only (``service.access.release_for``: 404 to analysts, grants included, and to
admins), and charged nothing — the owner already holds the raw data, so output seen by them
alone releases nothing to anyone else. Its ledger entry records the claim in words at ε = δ = 0
(``budgets.service.record_research``); the accountant's ε is reported only as a claim.
"""

from __future__ import annotations

from typing import Any

from dpcore.accounting.accountant import Accountant
from dpcore.mechanisms.spec import MechanismSpec
from service.errors import InvalidInput
from service.releases.schemas import ResearchOut

STATEMENT = (
    "RESEARCH RELEASE — NOT differentially private as claimed. The {accountant} accountant of "
    "{mechanism} reports ε = {epsilon:.6g} at δ = {delta:.3g}, but its analysis {caveat}, so "
    "that ε is not a valid bound. Shown to the dataset's owner only, never shared with "
    "analysts or admins, and charged nothing to the budget. Do not publish it."
)


def check(spec: MechanismSpec, accountant: Accountant, research: bool) -> None:
    """Refuse a request whose accountant and opt-in disagree, saying what to do instead."""
    if not accountant.releases:
        raise InvalidInput(
            f"the {accountant.name} accountant of {spec.name} analyses an algorithm the "
            f"service does not run ({accountant.caveat}); evaluate it offline with "
            f"`dprelease account {spec.name} --accountant {accountant.name}`"
        )
    if not accountant.valid_bound and not research:
        raise InvalidInput(
            f"the {accountant.name} accountant of {spec.name} is not a valid bound under "
            f"replace-one neighbours ({accountant.caveat}); use a valid accountant "
            f"('{spec.accounting.default}'), or set `research: true` for an owner-only "
            "research release charged nothing (its ε is then reported as a claim only)"
        )
    if accountant.valid_bound and research:
        raise InvalidInput(
            f"`research` is for accountants whose ε is not a bound; the {accountant.name} "
            f"accountant of {spec.name} is one: request an ordinary release (drop `research`)"
        )


def claim(
    spec: MechanismSpec, accountant: Accountant, *, epsilon: float, delta: float
) -> dict[str, Any]:
    """What a research release stores and shows: the accountant's claim, in numbers and words."""
    caveat = accountant.caveat or "misses data-dependent steps"
    return ResearchOut(
        statement=STATEMENT.format(
            accountant=accountant.name,
            mechanism=spec.name,
            epsilon=epsilon,
            delta=delta,
            caveat=f"leaves out what it must cover: {caveat}",
        ),
        claimed_epsilon=epsilon,
        claimed_delta=delta,
        caveat=caveat,
    ).model_dump()


def out(stored: dict[str, Any] | None) -> ResearchOut | None:
    return None if stored is None else ResearchOut.model_validate(stored)
