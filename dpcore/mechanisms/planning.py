"""What planning a release aims at and what it finds (``MechanismSpec.plan``).

A ``Target`` names the accountant and either an ε to calibrate the noise to or a σ to report
the ε of, at a δ; ``Planned`` is the answer: the resolved parameters, the accountant, its event
at the calibrated or given noise, and the (ε, δ) that event costs. The service's admission,
the benches and ``dprelease account`` plan through them; policy (budgets, rounding, who may
request what) stays with the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dpcore.accounting.accountant import Accountant, Event
    from dpcore.accounting.composition import Cost
    from dpcore.accounting.events import NoiseDescription

# A δ that follows from the event (the service's default share of the δ left follows the ε of
# a given noise).
DeltaRule = Callable[["Event"], float]


@dataclass(frozen=True)
class Target:
    """``accountant`` at ``epsilon`` (calibrate: the smallest noise meeting it at ``delta``) or
    at ``sigma`` (the noise given: its ε at ``delta`` is what it costs). ``delta``: a number,
    or a rule on the event (a given noise only); None where only the event is wanted.
    ``request_keys``: the request's own accountant keys (``sigma_y``, ``noise_ratio``)."""

    accountant: str
    epsilon: float | None = None
    sigma: float | None = None
    delta: float | DeltaRule | None = None
    request_keys: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.epsilon is None) == (self.sigma is None):
            raise ValueError("give exactly one of epsilon (calibrate) or sigma (report ε)")

    def event(self, accountant: Accountant, keys: Mapping[str, Any]) -> Event:
        """``accountant``'s event on ``keys``: at the given σ, or calibrated to the ε."""
        if self.sigma is not None:
            return accountant.at_sigma(self.sigma, keys)
        assert self.epsilon is not None
        if self.delta is None or callable(self.delta):
            raise ValueError("calibrating to an ε needs a δ")
        return accountant.calibrate(float(self.epsilon), self.delta, keys)

    def delta_for(self, event: Event) -> float:
        """The δ at which ``event`` is costed."""
        if self.delta is None:
            raise ValueError("costing a release needs a δ")
        return self.delta(event) if callable(self.delta) else self.delta


@dataclass(frozen=True)
class Planned:
    """A planned release: ``params`` resolved (shape defaults filled in) and admitted, the
    target's ``accountant``, its ``event`` at the calibrated or given noise, and ``cost``, the
    (ε, δ) the event costs at the target's δ (ε as the accountant gives it, not rounded).
    ``work``: the job's declared work in multiply-adds (``Admission.work``, from public figures
    only), None where the mechanism declares none."""

    params: BaseModel
    accountant: Accountant
    event: Event
    cost: Cost
    work: float | None = None

    @property
    def epsilon(self) -> float:
        return self.cost.epsilon

    @property
    def delta(self) -> float:
        return self.cost.delta

    @property
    def noise(self) -> NoiseDescription:
        return self.event.noise()

    @property
    def sigma(self) -> float:
        """The calibrated (or given) scale: σ_x where features and labels have their own."""
        return self.noise.sigma_x

    @property
    def description(self) -> dict[str, Any]:
        """The accountant's description of the event (its keys and figures)."""
        return self.event.describe()

    def stored_params(self) -> dict[str, Any]:
        """The parameters a release stores: the resolved ones, with the analysis parameters
        the accountant fixed (a coupling bound chosen for the target ε, say) where the
        mechanism has such a parameter."""
        stored = self.params.model_dump()
        for name, value in self.noise.analysis.items():
            if name in stored:
                stored[name] = value
        return stored
