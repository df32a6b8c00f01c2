"""Run an empirical privacy audit: the real mechanism on worst-case neighbours, a
distinguishing test with its threshold chosen on one half of the trials, and a Clopper–Pearson
ε lower bound from the other half, next to the ε the accountant claims for the same release.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpcore.accounting.accountant import Key
from dpcore.audit import stats
from dpcore.audit.case import AuditCase, Neighbours, Preprocess, RowModel, Wrap
from dpcore.audit.runs import Release, Run
from dpcore.mechanisms import registry
from dpcore.mechanisms.noise import sampler
from dpcore.mechanisms.planning import Target
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import one_hot

ACCOUNTANT = "tight"


@dataclass(frozen=True)
class Canary:
    """Record 0 of D (u) and of D′ (u′) as they shift a released row that holds them, per
    block, from the row's value without them (base)."""

    features: torch.Tensor
    features_prime: torch.Tensor
    base_features: torch.Tensor
    labels: torch.Tensor | None = None
    labels_prime: torch.Tensor | None = None
    base_labels: torch.Tensor | None = None


def audited() -> list[str]:
    """The mechanisms with an audit case."""
    return [s.name for s in registry.specs() if s.audit is not None]


def audit_keys(mechanism: str) -> tuple[Key, ...]:
    return _audit_spec(mechanism).keys


def parse_params(mechanism: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    keys = audit_keys(mechanism)
    known = {k.name: k for k in keys}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(
            f"unknown key(s) for the {mechanism} audit: {', '.join(unknown)}; "
            f"known: {', '.join(known)}"
        )
    return {
        k.name: k.parse(raw[k.name]) if raw.get(k.name) is not None else k.default for k in keys
    }


def _audit_spec(mechanism: str) -> Any:
    try:
        spec = registry.get(mechanism)
    except ValueError:
        spec = None
    if spec is None or spec.audit is None:
        raise ValueError(
            f"no audit for {mechanism!r}; audited: {', '.join(sorted(audited()))}"
        ) from None
    return spec.audit


def _case(mechanism: str) -> AuditCase:
    case: AuditCase = _audit_spec(mechanism).case()
    return case


def _log_presence(a: torch.Tensor, energy: float, model: RowModel) -> torch.Tensor:
    """log E[exp(B·c·a − B·c²·energy/2)], B ~ Bern(q), c ~ model: a row's log-likelihood ratio
    of "record 0 may be in it" against "it is not", given its whitened projection a."""
    c = torch.as_tensor(model.coefficients, dtype=torch.float64)
    log_w = torch.log(torch.as_tensor(model.weights, dtype=torch.float64))
    terms = a.unsqueeze(-1) * c - c**2 * energy / 2 + log_w
    present = torch.logsumexp(terms, dim=-1)
    if model.inclusion >= 1:
        return present
    q = model.inclusion
    return torch.logaddexp(torch.full_like(present, np.log1p(-q)), present + np.log(q))


def score(
    release: Release, canary: Canary, model: RowModel, sigma_x: float, sigma_y: float
) -> np.ndarray:
    """Σ over rows of the modelled log-likelihood ratio of D′ against D (larger: more D′)."""
    x = release.features[:, : model.rows].double() - canary.base_features
    y = None
    if release.labels is not None and canary.base_labels is not None:
        y = release.labels[:, : model.rows].double() - canary.base_labels
    out = torch.zeros(x.shape[:2], dtype=torch.float64)
    for u, v, sign in (
        (canary.features_prime, canary.labels_prime, 1.0),
        (canary.features, canary.labels, -1.0),
    ):
        a = x @ u / sigma_x**2
        energy = float(u @ u) / sigma_x**2
        if y is not None and v is not None:
            a = a + y @ v / sigma_y**2
            energy += float(v @ v) / sigma_y**2
        out += sign * _log_presence(a, energy, model)
    return out.sum(dim=1).numpy()


def _canary(
    spec: AuditCase, nb: Neighbours, model: RowModel, projection: torch.Tensor | None
) -> Canary:
    """The claimed geometry, from the worker's preprocessing whatever hook the run had (the
    auditor does not know of it). Record 1 stands for the others (they are identical): a
    row without record 0 holds only them; with ``displaces``, record 0 takes one's place."""
    features = torch.as_tensor(spec.preprocess(nb.X_prime[:2], nb), dtype=torch.float64)
    f_prime, other = features[0], features[1]
    f = torch.as_tensor(spec.preprocess(nb.X[:1], nb)[0], dtype=torch.float64)
    base = other if model.displaces else torch.zeros_like(other)
    f, f_prime = f - base, f_prime - base
    if projection is not None:
        f, f_prime, base = (projection.double() @ v for v in (f, f_prime, base))
    if spec.exact_labels:
        return Canary(f, f_prime, base)
    labels = torch.as_tensor(
        one_hot(np.concatenate([nb.labels[:2], nb.labels_prime[:1]]), nb.n_classes)
    )
    y, other_y, y_prime = labels[0], labels[1], labels[2]
    base_y = other_y if model.displaces else torch.zeros_like(other_y)
    return Canary(f, f_prime, base, y - base_y, y_prime - base_y, base_y)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # The audit's tensors are tiny: intra-op threads only add contention, much slower on a
    # loaded machine (docs/results/implementation.md).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def releases(
    mechanism: str,
    params: Mapping[str, Any],
    *,
    sigma_x: float,
    sigma_y: float,
    trials: int,
    seed: int = 0,
    preprocess: Preprocess | None = None,
    wrap: Wrap | None = None,
    noise_sampler: str = "fast",
) -> tuple[Release, Release, Neighbours]:
    """``trials`` releases of D and of D′ by the real mechanism, from one seeded secure source."""
    spec = _case(mechanism)
    p = parse_params(mechanism, params)
    nb = spec.neighbours(p)
    prep = preprocess or spec.preprocess
    if spec.exact_labels:
        labels = (torch.as_tensor(nb.labels), torch.as_tensor(nb.labels_prime))
    else:
        labels = (
            torch.as_tensor(one_hot(nb.labels, nb.n_classes), dtype=torch.float32),
            torch.as_tensor(one_hot(nb.labels_prime, nb.n_classes), dtype=torch.float32),
        )
    # Offline audits are reproducible from their seed (an explicit, public key).
    generator = SecureRandom.from_seed(seed)
    run = Run(
        features=torch.as_tensor(prep(nb.X, nb), dtype=torch.float32),
        features_prime=torch.as_tensor(prep(nb.X_prime, nb), dtype=torch.float32),
        labels=labels[0],
        labels_prime=labels[1],
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        trials=trials,
        generator=generator,
        noise=None if noise_sampler == "fast" else sampler(noise_sampler, generator),
    )
    function = spec.function(p)
    if wrap is not None:
        function = wrap(function)
    with _one_thread():
        release, release_prime = spec.run(function, run, p)
    return release, release_prime, nb


def run_audit(
    mechanism: str,
    params: Mapping[str, Any] | None = None,
    *,
    delta: float,
    epsilon: float | None = None,
    sigma: float | None = None,
    trials: int = 40_000,
    alpha: float = 0.05,
    seed: int = 0,
    preprocess: Preprocess | None = None,
    wrap: Wrap | None = None,
    noise_sampler: str = "fast",
) -> dict[str, Any]:
    """Audit ``mechanism`` at noise ``sigma`` (or the noise the accountant calibrates for
    ``epsilon``): ``trials`` releases of D and of D′ each, half to pick the threshold, half to
    bound ε. ``preprocess`` and ``wrap`` are test seams that plant bugs: the first replaces the
    worker's preprocessing of the raw records, the second wraps the dpcore mechanism function.
    """
    if (sigma is None) == (epsilon is None):
        raise ValueError("give exactly one of sigma or epsilon")
    if trials < 4 or not 0 < alpha < 1 or not 0 < delta < 1:
        raise ValueError("need trials >= 4, alpha in (0, 1) and delta in (0, 1)")
    spec = _case(mechanism)
    p = parse_params(mechanism, params or {})
    accountant = registry.accountant(mechanism, ACCOUNTANT)
    target = Target(ACCOUNTANT, epsilon=epsilon, sigma=sigma, delta=delta)
    event = target.event(accountant, spec.claim_keys(p))
    noise = event.noise()
    # Exact labels (no label noise) leave σ_y unused.
    sigma_x, sigma_y = noise.sigma_x, noise.sigma_y or 0.0
    if spec.label_scale is not None:
        sigma_y = noise.sigma(spec.label_scale)
    release, release_prime, nb = releases(
        mechanism,
        p,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        trials=trials,
        seed=seed,
        preprocess=preprocess,
        wrap=wrap,
        noise_sampler=noise_sampler,
    )
    model = spec.rows(p)
    canary = _canary(spec, nb, model, release.projection)
    s = score(release, canary, model, sigma_x, sigma_y)
    s_prime = score(release_prime, canary, model, sigma_x, sigma_y)
    half = trials // 2
    outcome = stats.selected_and_evaluated(s[: 2 * half], s_prime[: 2 * half], delta, alpha)
    return {
        "mechanism": mechanism,
        "params": p,
        "accountant": ACCOUNTANT,
        "noise": {**noise.to_json(), "sampler": noise_sampler},
        "delta": delta,
        "epsilon_claimed": event.epsilon(delta),
        "epsilon_lower_bound": outcome.epsilon_lower_bound,
        "confidence": 1 - alpha,
        "trials": {"per_dataset": trials, "threshold_selection": half, "evaluation": half},
        "threshold": outcome.threshold,
        "tpr": 1 - outcome.fnr,
        "fpr": outcome.fpr,
        "fnr": outcome.fnr,
        "fpr_upper": outcome.fpr_upper,
        "fnr_upper": outcome.fnr_upper,
        # The formula on the raw rates: not a bound (None when a rate is 0: infinite).
        "epsilon_point_estimate": (
            outcome.epsilon_point_estimate
            if math.isfinite(outcome.epsilon_point_estimate)
            else None
        ),
        "test": "guess D' (record 0 replaced) when the score exceeds the threshold",
        "inequality": outcome.inequality,
        "canary": _describe_canary(canary),
        "row_model": {"inclusion": model.inclusion, "coefficients": len(model.coefficients)},
        "seed": seed,
    }


def _describe_canary(canary: Canary) -> dict[str, float]:
    out = {"feature_distance": float(torch.linalg.norm(canary.features - canary.features_prime))}
    if canary.labels is not None and canary.labels_prime is not None:
        out["label_distance"] = float(torch.linalg.norm(canary.labels - canary.labels_prime))
    return out
