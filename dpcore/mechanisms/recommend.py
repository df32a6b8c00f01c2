"""Recommended configurations: per mechanism, the configuration measured best on
the public dataset nearest to a request's public shape, adapted to that shape and checked
admissible.

The table (``recommendations.json`` beside this module, shipped with the package) is written
by ``bench/recommendations.py`` from the studies' CSVs (docs/results/tabular.csv,
sweet_spot.csv): one entry per (public dataset, ε, mechanism), the configuration with the best
mean over the trained models of its metric.

A lookup reads public facts only: n (public under replace-one), the declared features and
classes, whether the declared shape is an image, the request's ε and the server's caps. The
dataset's class counts are private and never read: admission checks run on a copy of the facts
whose counts are those of a balanced dataset of the same shape (``public_only``), so a
configuration recommended for an unbalanced dataset can still be refused, to the owner, by the
real counts — as its defaults can (dpcda's ``min_class_size``).

Distance from a request (ε, n, d, c) to a measured entry (ε', n', d', c'), among the entries of
the same kind (image or table; entries of the other kind only when a mechanism has none of the
same kind, flagged)::

    |ln(ε/ε')| + |ln(n/n')| + |ln(d/d')|/2 + |ln(c/c')|/2

ε and n weigh most: they set the noise per record. Ties go to the smaller ε' (a configuration
that held up under more noise), then to the dataset's name.

Adaptation to the request's shape: a count of released rows (``n_samples``, or a shape default
marked ``per_row``) keeps its measured ratio to n, never above what the shape default gives
(n, lowered to the server's caps); every other parameter is kept as measured. The candidate is
validated by the mechanism's request model, its shape defaults are resolved (``resolve``) and
its admission checks run; if it fails, the shape-bound parameters are dropped (their defaults
follow the request's shape), and if that fails too, every parameter is left to its default. A
mechanism none of whose candidates passes gets no recommendation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from dpcore.mechanisms.spec import InvalidParams, MechanismSpec, PublicFacts

TABLE = Path(__file__).with_name("recommendations.json")
ROWS_PARAM = "n_samples"  # every served mechanism's name for the released row count


@dataclass(frozen=True)
class Measured:
    """One entry of the table: the best configuration of ``mechanism`` on ``dataset`` at
    ``epsilon`` — its mean ``score`` over models of ``metric``, the spread (max − min) of the
    per-repeat score, each model's mean metrics, and how many configurations competed."""

    dataset: str
    n: int
    d: int
    classes: int
    image: bool
    epsilon: float
    delta: float
    mechanism: str
    params: dict[str, Any]
    metric: str
    models: tuple[str, ...]
    score: float
    spread: float
    repeats: int
    metrics: dict[str, float]
    candidates: int
    source: str

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Measured:
        """An entry, checked field by field: a malformed table fails loudly at load."""
        entry = cls(
            dataset=str(raw["dataset"]),
            n=int(raw["n"]),
            d=int(raw["d"]),
            classes=int(raw["classes"]),
            image=bool(raw["image"]),
            epsilon=float(raw["epsilon"]),
            delta=float(raw["delta"]),
            mechanism=str(raw["mechanism"]),
            params=dict(raw["params"]),
            metric=str(raw["metric"]),
            models=tuple(str(m) for m in raw["models"]),
            score=float(raw["score"]),
            spread=float(raw["spread"]),
            repeats=int(raw["repeats"]),
            metrics={str(k): float(v) for k, v in raw["metrics"].items()},
            candidates=int(raw["candidates"]),
            source=str(raw["source"]),
        )
        if min(entry.n, entry.d, entry.classes, entry.repeats, entry.candidates) < 1:
            raise ValueError(f"table entry {raw!r}: n, d, classes, repeats must be ≥ 1")
        if not (math.isfinite(entry.epsilon) and entry.epsilon > 0 and entry.models):
            raise ValueError(f"table entry {raw!r}: ε must be finite > 0, models non-empty")
        return entry


@dataclass(frozen=True)
class Shape:
    """A request's public facts the distance reads."""

    n: int
    d: int
    classes: int
    image: bool
    epsilon: float


@dataclass(frozen=True)
class Recommendation:
    """``params``: what to send (``POST /releases``' params); ``resolved``: with every shape
    default filled in, as admission stores it; ``measured``: the entry it comes from (None:
    the mechanism is not in the table and its defaults are recommended); ``notes``: what was
    adapted or dropped, and why."""

    mechanism: str
    kind: str
    params: dict[str, Any]
    resolved: dict[str, Any]
    measured: Measured | None
    distance: float | None
    kind_matches: bool
    notes: tuple[str, ...]

    @property
    def why(self) -> str:
        if self.measured is None:
            head = f"{self.mechanism} is not in the measured table: its defaults"
        else:
            m = self.measured
            head = (
                f"best mean {m.metric.replace('_', ' ')} over {', '.join(m.models)} "
                f"({m.score:.3f}, spread {m.spread:.3f} over {m.repeats} run(s)) of "
                f"{m.candidates} configuration(s) measured on {m.dataset} (n={m.n}, d={m.d}, "
                f"{m.classes} classes, ε={m.epsilon:g}), the nearest measured shape "
                f"(distance {self.distance:.2f})"
            )
            if not self.kind_matches:
                head += f"; measured on {'images' if m.image else 'tables'} only"
        return "; ".join((head, *self.notes))


def load(path: Path = TABLE) -> tuple[Measured, ...]:
    raw = json.loads(path.read_text())
    return tuple(Measured.from_json(e) for e in raw["entries"])


@lru_cache(maxsize=1)
def table() -> tuple[Measured, ...]:
    """The shipped table, read once."""
    return load()


def shape_of(facts: PublicFacts, epsilon: float) -> Shape:
    """The public shape: an image when the declared feature shape has two or more axes."""
    return Shape(
        n=facts.n,
        d=facts.n_features,
        classes=facts.n_classes,
        image=len(facts.feature_shape) >= 2,
        epsilon=epsilon,
    )


def distance(shape: Shape, entry: Measured) -> float:
    def gap(a: float, b: float) -> float:
        return abs(math.log(max(a, 1e-300) / max(b, 1e-300)))

    return (
        gap(shape.epsilon, entry.epsilon)
        + gap(shape.n, entry.n)
        + gap(shape.d, entry.d) / 2
        + gap(shape.classes, entry.classes) / 2
    )


def nearest(
    entries: Iterable[Measured], mechanism: str, shape: Shape
) -> tuple[Measured, float, bool] | None:
    """(entry, distance, same kind) of ``mechanism``'s nearest entry, or None if it has none."""
    mine = [e for e in entries if e.mechanism == mechanism]
    same = [e for e in mine if e.image == shape.image]
    pool = same or mine
    if not pool:
        return None
    best = min(pool, key=lambda e: (round(distance(shape, e), 12), e.epsilon, e.dataset))
    return best, distance(shape, best), bool(same)


def public_only(facts: PublicFacts) -> PublicFacts:
    """``facts`` without the private class counts: those of a balanced dataset of the same
    public shape stand in (a check comparing a parameter with the smallest class then
    compares it with ⌊n/classes⌋, a public figure)."""
    k = max(1, facts.n_classes)
    return replace(facts, class_counts=(facts.n // k,) * k)


def _row_params(spec: MechanismSpec) -> set[str]:
    rows = {d.name for d in spec.admission.shape_defaults if d.per_row}
    if ROWS_PARAM in spec.params.model_fields:
        rows.add(ROWS_PARAM)
    return rows


def adapt(spec: MechanismSpec, entry: Measured, facts: PublicFacts) -> dict[str, Any]:
    """The entry's params at the request's shape: row counts keep their ratio to n, never
    above the shape default's (or the caps') row count; the rest as measured."""
    params = dict(entry.params)
    defaults = {d.name: d for d in spec.admission.shape_defaults}
    for name in _row_params(spec) & set(params):
        if params[name] is None:
            continue
        scaled = max(1, round(params[name] * facts.n / entry.n))
        default = defaults.get(name)
        cap = default.value(params, facts) if default is not None else facts.default_rows()
        params[name] = min(scaled, cap)
    return params


def admissible(
    spec: MechanismSpec,
    params: Mapping[str, Any],
    facts: PublicFacts,
    target: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """``params`` resolved (shape defaults filled in) if the request model takes them, the
    mechanism's admission checks pass on ``facts`` and, given the ``target`` (ε, δ), its
    default accountant's preparation for that target does too (e.g. dpcda's DP class counts
    must not cost the whole target on their own); InvalidParams (or pydantic's
    ValidationError, a ValueError) otherwise. Public keys only, and no calibration."""
    request = spec.request_params.model_validate(dict(params))
    resolved = spec.resolve(request, facts)
    spec.check(resolved, facts)
    accountant = spec.accountant(spec.accounting.default)
    if target is not None and accountant.prepare is not None:
        keys = accountant.parse_keys(spec.accountant_keys(accountant, resolved, facts))
        accountant.prepare(keys, *target)
    return resolved.model_dump()


def recommend(
    spec: MechanismSpec,
    facts: PublicFacts,
    epsilon: float,
    entries: Iterable[Measured] | None = None,
    delta: float | None = None,
) -> Recommendation | None:
    """``spec``'s recommendation for a dataset of these public facts at ``epsilon``; None
    when no candidate (measured, shape defaults, all defaults) passes admission (with
    ``delta``: also the accountant's preparation for the target (ε, δ))."""
    facts = public_only(facts)
    shape = shape_of(facts, epsilon)
    found = nearest(table() if entries is None else entries, spec.name, shape)
    notes: list[str] = []
    candidates: list[dict[str, Any]] = []
    if found is not None:
        measured = adapt(spec, found[0], facts)
        shaped = {d.name for d in spec.admission.shape_defaults} | _row_params(spec)
        candidates += [measured, {k: v for k, v in measured.items() if k not in shaped}]
        changed = sorted(k for k in measured if measured[k] != found[0].params.get(k))
        if changed:
            notes.append(
                ", ".join(f"{k} {found[0].params[k]} → {measured[k]}" for k in changed)
                + " (the measured share of n, within the server's caps)"
            )
    candidates.append({})
    tried: list[str] = []
    for candidate in dict.fromkeys(json.dumps(c, sort_keys=True) for c in candidates):
        params = json.loads(candidate)
        try:
            resolved = admissible(spec, params, facts, None if delta is None else (epsilon, delta))
        except (InvalidParams, ValueError, ArithmeticError) as exc:  # what admission refuses
            tried.append(f"{candidate} is not admissible here ({_first_line(exc)})")
            continue
        if tried:
            notes += [*tried, f"recommended instead: {candidate} (defaults for the rest)"]
        return Recommendation(
            mechanism=spec.name,
            kind=spec.guidance.kind,
            params=params,
            resolved=resolved,
            measured=found[0] if found else None,
            distance=found[1] if found else None,
            kind_matches=found[2] if found else True,
            notes=tuple(notes),
        )
    return None


def recommend_all(
    specs: Iterable[MechanismSpec],
    facts: PublicFacts,
    epsilon: float,
    entries: Iterable[Measured] | None = None,
    delta: float | None = None,
) -> list[Recommendation]:
    entries = tuple(table() if entries is None else entries)
    found = (recommend(spec, facts, epsilon, entries, delta) for spec in specs)
    return [r for r in found if r is not None]


def _first_line(exc: Exception) -> str:
    """A refusal in one line: pydantic's first error (its location and message), else the
    exception's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
