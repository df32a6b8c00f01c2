"""The ledger's privacy filter: admission that stays valid when releases are chosen adaptively.

The owner sees each release before asking for the next and picks its mechanism, noise and ε,
so the ledger must be a *privacy filter*: a rule that, given the costs admitted so far (public)
and a new request's cost, admits or refuses it, such that the whole interaction is (ε, δ)-DP
whatever the adaptive choices. Taking, after the fact, the smallest of several composition
bounds is not known to be one. This filter is (docs/privacy.md, "The ledger"):

- every admitted release is charged in one of two ways, fixed at its admission:
  ``basic``: its own (ε_i, δ_i) — any valid (ε_i, δ_i) guarantee, e.g. a PLD bound;
  ``renyi``: its RDP curve ρ_i on the grid ``FILTER_ORDERS``;
- the first ``renyi`` charge reserves δ_R, a share of the δ then left (``new_group_delta``:
  never all of it unless the release asks for the whole ε left); the ``renyi`` group is then
  worth ε_R = min over α in the grid of Σρ_i(α) + log(|grid|/δ_R)/(α − 1) (a Rényi filter
  over a grid of orders with δ_R split evenly between them: Feldman–Zrnic 2021, Lécuyer 2021);
- spent ε = Σ_basic ε_i + ε_R, spent δ = Σ_basic δ_i + δ_R (δ_R only once a ``renyi`` charge
  exists); a request is admitted only if both stay within the budget.

With one ``renyi``-free ledger this is basic composition with adaptively chosen parameters
(Rogers, Roth, Ullman, Vadhan 2016), so one release may use the whole budget at its PLD-tight
noise. Each charge's way is chosen at admission from public figures only (the one that leaves
the smaller spent ε), which the proof allows: it only needs the way fixed before the release
runs. Nothing here is ever re-charged another way after the fact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from dpcore.accounting.orders import ORDERS

Mode = Literal["basic", "renyi"]

# A grid of Rényi orders for the filter, a subset of ``ORDERS`` (where curves are stored). Every
# order in it costs log(|grid|)/(α − 1) more (δ_R is split between them), so it is short; it
# spans the orders where the service's mechanisms have their best conversion.
FILTER_ORDERS: tuple[float, ...] = (
    1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0,
    16.0, 20.0, 24.0, 32.0, 40.0, 48.0, 63.0, 128.0, 256.0, 1024.0,
)  # fmt: skip
_INDEX = tuple(ORDERS.index(a) for a in FILTER_ORDERS)

# Share of the δ left that a new Rényi group reserves as its δ_R (unless the release opening
# it asks for a larger share of the ε left). The rest stays for (ε, δ) releases: a group that
# took every δ left would refuse every later release without an RDP curve while ε remains.
# Halving δ_R costs the group log(2)/(α − 1) of ε at its best order α.
GROUP_DELTA_SHARE = 0.5


@dataclass(frozen=True)
class Charge:
    """What the filter holds for one release: its way and the figures that way composes —
    (ε_i, δ_i) for ``basic``; for ``renyi`` the RDP curve on ``ORDERS`` and the group's δ_R."""

    mode: Mode
    epsilon: float
    delta: float
    rdp: tuple[float, ...] | None = None
    group_delta: float = 0.0

    def __post_init__(self) -> None:
        if self.mode == "basic":
            if not (math.isfinite(self.epsilon) and self.epsilon >= 0 and 0 <= self.delta < 1):
                raise ValueError(f"a basic charge needs finite ε ≥ 0, δ in [0, 1): {self}")
        elif self.mode == "renyi":
            if self.rdp is None or len(self.rdp) != len(ORDERS):
                raise ValueError(f"a renyi charge needs an RDP curve on {len(ORDERS)} orders")
            if not all(v >= 0 for v in self.rdp):  # also refuses NaN
                raise ValueError("an RDP curve must be >= 0 at every order")
            if not 0 < self.group_delta < 1:
                raise ValueError(f"a renyi charge needs δ_R in (0, 1), got {self.group_delta}")
        else:
            raise ValueError(f"unknown charge mode {self.mode!r}")


@dataclass(frozen=True)
class Spend:
    """The filter's state: what the holding charges consume, and the budget."""

    budget_epsilon: float
    budget_delta: float
    basic_epsilon: float = 0.0
    basic_delta: float = 0.0
    renyi: tuple[float, ...] | None = None  # Σρ_i on FILTER_ORDERS, None: no renyi charge
    group_delta: float = 0.0

    @property
    def renyi_epsilon(self) -> float:
        if self.renyi is None:
            return 0.0
        return renyi_epsilon(self.renyi, self.group_delta)

    @property
    def epsilon(self) -> float:
        return self.basic_epsilon + self.renyi_epsilon

    @property
    def delta(self) -> float:
        return sum_up(self.basic_delta, self.group_delta if self.renyi is not None else 0.0)

    @property
    def delta_left(self) -> float:
        """budget δ − spent δ, rounded down so that adding it back never passes the budget
        (a Rényi group that takes it must still fit)."""
        spent = self.delta
        left = self.budget_delta - spent
        # The sum is rounded up (``sum_up``): step down until it fits (an ulp or two).
        while left > 0 and sum_up(spent, left) > self.budget_delta:
            left = math.nextafter(left, 0.0)
        return max(0.0, left)

    def within_budget(self, slack: float = 0.0) -> bool:
        """Whether the spend fits the budget. With a relative ``slack`` the ε is first rounded
        up by it and one ulp more (the ledger's rounding against the user: admission, its
        choice of way and the spend it shows agree); δ sums are never rounded down."""
        epsilon = self.epsilon
        if slack and epsilon > 0:
            epsilon = math.nextafter(epsilon * (1 + slack), math.inf)
        return epsilon <= self.budget_epsilon and self.delta <= self.budget_delta

    def add(self, charge: Charge) -> Spend:
        if charge.mode == "basic":
            return Spend(
                self.budget_epsilon,
                self.budget_delta,
                self.basic_epsilon + charge.epsilon,
                sum_up(self.basic_delta, charge.delta),
                self.renyi,
                self.group_delta,
            )
        assert charge.rdp is not None
        curve = tuple(charge.rdp[i] for i in _INDEX)
        if self.renyi is None:
            total, group = curve, charge.group_delta
        else:
            total = tuple(a + b for a, b in zip(self.renyi, curve, strict=True))
            # Holding renyi charges share one δ_R (see ``spend``): keep the smaller for the
            # conversion, so a disagreement could only make ε larger.
            group = min(self.group_delta, charge.group_delta)
        return Spend(
            self.budget_epsilon,
            self.budget_delta,
            self.basic_epsilon,
            self.basic_delta,
            total,
            group,
        )

    def new_group_delta(self, epsilon: float) -> float:
        """δ_R of a Rényi group that a release of own ε ``epsilon`` would open now: a share of
        the δ left — ``GROUP_DELTA_SHARE``, or the release's share of the ε left when larger
        (all of it for a release asking the whole remaining ε). Never the whole δ left
        otherwise, so (ε, δ) releases after it still find δ (docs/privacy.md, "Default δ").
        A function of public figures only, as the filter's proof requires."""
        left = self.delta_left
        epsilon_left = self.budget_epsilon - self.epsilon
        if epsilon_left <= 0 or epsilon >= epsilon_left:
            return left
        share = max(GROUP_DELTA_SHARE, epsilon / epsilon_left)
        return left * share if share < 1 else left

    def options(self, epsilon: float, delta: float, rdp: Sequence[float] | None) -> list[Charge]:
        """The ways one release with guarantee (``epsilon``, ``delta``) and, if known, RDP
        curve ``rdp`` can be charged next (whether the budget admits them is not checked)."""
        out = [Charge("basic", epsilon, delta)]
        if rdp is not None:
            group = self.group_delta if self.renyi is not None else self.new_group_delta(epsilon)
            if group > 0:
                out.append(Charge("renyi", 0.0, 0.0, tuple(rdp), group))
        return out

    def choose(
        self, epsilon: float, delta: float, rdp: Sequence[float] | None, *, slack: float = 0.0
    ) -> tuple[Charge, Spend]:
        """The way to charge a release: of the ways the budget admits, the one leaving the
        smaller spent ε (ties: ``basic``); if none fits, the one leaving the smaller spent ε,
        so the caller can report it. Uses public figures only."""
        candidates = [(c, self.add(c)) for c in self.options(epsilon, delta, rdp)]
        fitting = [pair for pair in candidates if pair[1].within_budget(slack)]
        pool = fitting or candidates
        return min(pool, key=lambda pair: (pair[1].epsilon, pair[1].delta))


def sum_up(a: float, b: float) -> float:
    """a + b rounded up: the float at or above the exact sum (TwoSum's error term tells
    whether rounding to nearest fell below it), so δs spent are never under-counted."""
    total = a + b
    b_part = total - a
    below = (a - (total - b_part)) + (b - b_part)
    return math.nextafter(total, math.inf) if below > 0 else total


def renyi_epsilon(curve: Sequence[float], group_delta: float) -> float:
    """ε of a Rényi filter over ``FILTER_ORDERS`` holding ``curve`` (on that grid) with
    δ_R = ``group_delta`` split evenly between the orders."""
    if not 0 < group_delta < 1:
        return math.inf
    log_term = math.log(len(FILTER_ORDERS) / group_delta)
    return min(r + log_term / (a - 1) for r, a in zip(curve, FILTER_ORDERS, strict=True))


def spend(budget_epsilon: float, budget_delta: float, charges: Iterable[Charge]) -> Spend:
    """The filter's state after ``charges`` (the holding ones, in admission order)."""
    state = Spend(budget_epsilon, budget_delta)
    groups = set()
    for charge in charges:
        state = state.add(charge)
        if charge.mode == "renyi":
            groups.add(charge.group_delta)
    if len(groups) > 1:
        # Cannot happen through ``choose`` (a group keeps its δ_R while a renyi charge holds);
        # if it did, count the largest δ_R as spent and convert at the smallest.
        state = Spend(
            state.budget_epsilon,
            state.budget_delta,
            state.basic_epsilon,
            state.basic_delta + max(groups) - min(groups),
            state.renyi,
            min(groups),
        )
    return state
