"""DP-CDA accountants (``paper``, ``tight``): the events of a release from its public keys.

The mixing's analysis and events are ``accounting_mixing``'s; class sizes under DP compose
with them in ``accounting_counts``; DP standardisation statistics compose here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpcore.accounting.accountant import Event
from dpcore.accounting.composition import Cost
from dpcore.accounting.events import ComposedEvent, GaussianQuery
from dpcore.accounting.orders import epsilon_from_rdp
from dpcore.mechanisms.class_mixing import record_distance
from dpcore.mechanisms.dpcda.accounting_counts import COUNT_SENSITIVITY, DPCountsMixing
from dpcore.mechanisms.dpcda.accounting_mixing import (
    DPCDAEvent,
    DPCDAPaperEvent,
    nonnegative_features,
    statistics_step,
)


def _args(sigma: float, keys: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        keys["n"],
        keys["mixture_degree"],
        keys["n_samples"],
        keys["clip_norm"],
        keys["n_classes"],
        keys["min_class_size"],
        sigma,
        nonnegative_features(keys.get("standardization") or "declared"),
    )


def guess(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    # The unamplified Gaussian's σ (sensitivity R/ℓ), scaled by the sampling ratio and √T_c.
    ell, m, k, t = (
        keys["mixture_degree"],
        keys["min_class_size"],
        keys["n_classes"],
        keys["n_samples"],
    )
    spread = record_distance(
        clip_norm=keys["clip_norm"],
        nonnegative=nonnegative_features(keys.get("standardization") or "declared"),
    )
    sigma = math.sqrt(2 * math.log(1.25 / delta)) * spread / (epsilon * ell)
    return sigma * max(ell / max(m, 1) * math.sqrt(-(-t // max(k, 1))), 1e-3)


def _with_statistics(event: DPCDAPaperEvent, keys: Mapping[str, Any]) -> Event:
    # DP statistics are charged exactly when the release estimates them (as the params
    # model requires): an accountant asked about one without the other would misstate it.
    if (keys.get("standardization") == "dp") != (keys.get("stats_noise") is not None):
        raise ValueError("stats_noise goes with standardization 'dp' (and is required there)")
    if keys.get("stats_noise") is None:
        return event
    if keys.get("d_x") is None:
        raise ValueError("DP statistics (stats_noise) need d_x, the feature dimension")
    step = statistics_step(stats_noise=keys["stats_noise"], n_features=keys["d_x"])
    if isinstance(event, DPCDAEvent):
        return DPCDAAfterStatistics((step, event), calibrated="features")
    return ComposedEvent((step, event), calibrated="features")


@dataclass(frozen=True)
class DPCDAAfterStatistics(ComposedEvent):
    """DP statistics, then the mixing (``tight``): ε = min(PLD of each case composed with
    the statistics' Gaussian, the composed RDP curve); the cost keeps the curve."""

    def epsilon(self, delta: float) -> float:
        return _after_statistics_epsilon(self, float(delta))

    def cost(self, delta: float) -> Cost:
        return Cost(epsilon=self.epsilon(delta), delta=delta, rdp=self.rdp())


@functools.lru_cache(maxsize=256)
def _after_statistics_epsilon(event: DPCDAAfterStatistics, delta: float) -> float:
    from dpcore.mechanisms.dpcda import accounting_pld

    step, mixing = event.steps
    assert isinstance(step, GaussianQuery) and isinstance(mixing, DPCDAEvent)
    pld = max(
        accounting_pld.epsilons_after_gaussian(
            mixing.sampling_prob,
            mixing.noise_multiplier,
            mixing.mixtures_per_class,
            mixing.n_classes,
            step.mu,
            delta,
        )
    )
    pld = pld if pld == pld else math.inf  # NaN (extreme noise): no PLD bound
    return min(pld, epsilon_from_rdp(event.rdp(), delta=delta))


#: The class-size mode of keys that name none: the parameters' default.
CLASS_SIZES_DEFAULT = "dp"


def class_sizes_of(keys: Mapping[str, Any]) -> str:
    return str(keys.get("class_sizes") or CLASS_SIZES_DEFAULT)


def paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    if class_sizes_of(keys) != "declared":
        raise ValueError(
            "the paper accountant analyses class_sizes 'declared' only (set class_sizes: "
            "'declared'; the default is 'dp')"
        )
    return _with_statistics(DPCDAPaperEvent(*_args(sigma, keys)), keys)


def count_noise_of(keys: Mapping[str, Any]) -> float:
    """The keys' count_noise: the request's, or the one ``prepare`` chose for the target
    (``params.count_noise_for_target``; admission stores it with the parameters). Left out
    with no target (a release at a given σ), the public rule on the same keys
    (``params.default_count_noise``), so the CLI and the service cost the same release."""
    from dpcore.mechanisms.dpcda.params import default_count_noise

    if keys.get("count_noise") is not None:
        return float(keys["count_noise"])
    return default_count_noise(keys["min_class_size"], keys["n_classes"])


def failure_prob_of(keys: Mapping[str, Any]) -> float:
    """β as given; left out, ``prepare`` chose it for the target, or (at a given σ, no
    target) the reference 1e-9."""
    from dpcore.mechanisms.dpcda.params import REFERENCE_FAILURE_PROB

    return float(keys.get("class_size_failure_prob") or REFERENCE_FAILURE_PROB)


def tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    event = DPCDAEvent(*_args(sigma, keys))
    if class_sizes_of(keys) == "declared":
        if keys.get("count_noise") is not None:
            raise ValueError("count_noise goes with class_sizes 'dp' only")
        return _with_statistics(event, keys)
    # DP class sizes: one event composes the statistics, the counts and the mixing
    # (``accounting_counts``).
    stats = _with_statistics(event, keys)
    stats_noise = stats_sensitivity = None
    if isinstance(stats, ComposedEvent):
        step = stats.steps[0]
        assert isinstance(step, GaussianQuery)
        stats_noise, stats_sensitivity = step.scale.sigma, step.scale.sensitivity
    n, ell, t, clip, k, m, noise, nonnegative = _args(sigma, keys)
    return DPCountsMixing(
        n,
        ell,
        t,
        clip,
        k,
        m,
        noise,
        nonnegative,
        count_noise=count_noise_of(keys),
        failure_prob=failure_prob_of(keys),
        stats_noise=stats_noise,
        stats_sensitivity=stats_sensitivity,
    )


def _statistics_mu2(keys: Mapping[str, Any]) -> float:
    """μ² of the DP standardisation statistics (0 without them)."""
    if keys.get("stats_noise") is None or keys.get("d_x") is None:
        return 0.0
    return 2 * keys["d_x"] / float(keys["stats_noise"]) ** 2


def prepare(keys: dict[str, Any], epsilon: float, delta: float) -> dict[str, Any]:
    """Before calibrating a 'dp' release: choose, for the target, β when none is given
    (``params.default_failure_prob``) and count_noise when none is given
    (``params.count_noise_for_target``: the counts take at most a fixed share of the target,
    so a default request is never refused for them); the event's analysis carries both, and
    admission stores them with the parameters. Then refuse, with the reason, a target that
    the noisy class counts (at a count_noise the request gave) and DP statistics alone
    already exceed — no feature noise can meet it. Public keys only."""
    if class_sizes_of(keys) == "declared":
        return keys
    from dpcore.mechanisms.dpcda.params import count_noise_for_target, default_failure_prob

    if keys.get("class_size_failure_prob") is None:
        keys = {**keys, "class_size_failure_prob": default_failure_prob(epsilon, delta)}
    stats_mu2 = _statistics_mu2(keys)
    chosen = keys.get("count_noise") is None
    if chosen:
        keys = {
            **keys,
            "count_noise": count_noise_for_target(
                keys["min_class_size"], keys["n_classes"], epsilon, delta, stats_mu2
            ),
        }
    from dpcore.accounting.gdp import delta_of, epsilon_of

    sigma_c = count_noise_of(keys)
    mu2 = (COUNT_SENSITIVITY / sigma_c) ** 2 + stats_mu2
    # The counts are a marginal of the release: at the target ε they alone need δ(ε) of
    # μ-GDP, so a larger one than δ leaves nothing for the mixing.
    if delta_of(math.sqrt(mu2), epsilon) > delta:
        floor = epsilon_of(math.sqrt(mu2), delta)
        if chosen:
            # The chosen count noise takes a share of what the statistics leave: only they
            # can exceed the target.
            raise ValueError(
                f"standardization 'dp': the DP statistics (stats_noise {keys['stats_noise']:.4g})"
                f" and the noisy class counts alone cost ε {floor:.3g} at δ {delta:g}, not "
                f"below the target {epsilon:g}: raise stats_noise or ε, or declare the "
                "standardisation statistics"
            )
        raise ValueError(
            f"class_sizes 'dp': the noisy class counts (count_noise {sigma_c:.4g}"
            + (", and the DP statistics" if keys.get("stats_noise") is not None else "")
            + f") alone cost ε {floor:.3g} at δ {delta:g}, not below the target {epsilon:g}: "
            "raise count_noise (the lower bounds then sit further below the counts: lower "
            "min_class_size with it) or leave it out (chosen for the target), raise ε, or opt "
            "in to class_sizes 'declared' (a narrower neighbour relation)"
        )
    return keys
