"""ClustMix's accountants of the averaging step (Madl, Xu, Choudhury, Howard — "Approximate,
Adapt, Anonymize (3A)"): ``paper`` and ``fixed``; variant dp's are in ``accounting``.

Mechanism (final step). Each cluster t of the records (clusters within classes) releases its
mean plus noise, x′_t = (1/N_t) Σ_{i∈t} x_i + N(0, σ² I_D), with every cluster of size
N_t ≥ l = ``cluster_size`` (a public lower bound). σ is that one noise std, the same for every
cluster (the paper's per-cluster σ_t, computed from the private size N_t, is not covered). The
label of a cluster mean is its cluster's class, which the clustering fixes: no label noise.

``paper`` — Eq. 8 (Theorem 2): μ-GDP with μ = √(C·D)/(l·σ), C = ``n_classes``, D =
``n_features``, converted exactly by δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (the paper's
Nelder–Mead is replaced by a bracketing root finder in log ε, ``gdp.epsilon_of``). The paper
counts only the final noisy averaging: its clustering (GMM on raw data), the cluster sizes and
the KIP adaptation are data-dependent and unaccounted, so this is a reproduction, not a valid
bound. The paper prints no σ; its MNIST settings (δ = 1e-5, C = 10, D = 784) give by Eq. 8
σ ≈ 2.7994 at ε = 1 with ~118 records per mixture and σ ≈ 72.18 at ε = 0.2 with ~20 (pinned
in the tests; the paper's own σ is not printed, so these only pin Eq. 8).

``fixed`` — ONLY the final noisy averaging, for a clustering that is FIXED: each record's
cluster is a function of that record alone and of public or already-paid-for information
(e.g. its class and the nearest of some released centroids) — never of the other records.
The data-dependent steps (GMM clustering, cluster sizes as inputs to σ, KIP adaptation) are
NOT covered and must be charged separately. Records are clipped to ‖x‖ ≤ 1.

Sensitivity of the vector of all cluster means, replace-one (x in D becomes x′ in D′, both
datasets with every cluster of size ≥ l). Write m_S for the mean of a multiset S.
- x and x′ in the same cluster t (size N ≥ l in both): m changes by (x′ − x)/N,
  norm ≤ ‖x′ − x‖/N ≤ 2/l.
- x in cluster A, x′ in cluster B ≠ A (it may change class): only A and B change.
  A loses x: N_A ≥ l + 1 (A ∖ {x} still has ≥ l records), and
  m_A − m_{A∖x} = (x − m_{A∖x})/N_A, norm ≤ 2/N_A ≤ 2/(l + 1) (‖x‖, ‖m_{A∖x}‖ ≤ 1).
  B gains x′: N_B ≥ l, m_{B∪x′} − m_B = (x′ − m_B)/(N_B + 1), norm ≤ 2/(l + 1).
  Together: √2 · 2/(l + 1).
- x or x′ in no cluster (dropped records): one of the two terms above, ≤ 2/(l + 1).
So Δ = max(2/l, 2√2/(l + 1)) (= 2√2/(l + 1) for l ≥ 3), attained by x = e₁ against l
records at −e₁ and x′ = e₂ joining l records at −e₂. Adding N(0, σ²I) to every mean is the
Gaussian mechanism: μ-GDP with μ = Δ/σ (Dong, Roth, Su 2019, Thm 2.7), converted exactly.
D and C do not enter: the bound is on L2 norms after clipping, whatever the dimension, and a
record moves at most two cluster means whatever the number of classes (the keys are accepted
so that one key set serves both accountants). If features are only known to lie in [0, 1]^D
without the norm clip, scale σ by √D (the norm bound becomes √D).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpcore.accounting import gdp
from dpcore.accounting.composition import GaussianEvent
from dpcore.accounting.events import NoiseDescription, NoiseScale


def _as_int(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


def _check_sigma(sigma: float) -> None:
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be finite and > 0, got {sigma}")


def paper_sensitivity(cluster_size: int, n_features: int) -> float:
    """L2 sensitivity of the vector of all cluster means for records in [0, 1]^D (Algorithm
    2's domain, no row scaling) over a fixed clustering with every cluster ≥ l: the argument of
    ``means_sensitivity`` with ‖x − x′‖ ≤ √D and ‖x − m‖ ≤ √D, i.e. √D·max(1/l, √2/(l + 1)).
    It is what the paper variant's noise declares (its secure sampler's lattice is planned
    from it); Eq. 8 itself counts √(CD)/l."""
    ell = cluster_size
    return math.sqrt(n_features) * max(1.0 / ell, math.sqrt(2.0) / (ell + 1))


def means_sensitivity(cluster_size: int) -> float:
    """L2 sensitivity of the vector of all cluster means (fixed clustering, ‖x‖ ≤ 1, every
    cluster of size ≥ cluster_size in both neighbours): max(2/l, 2√2/(l + 1))."""
    ell = cluster_size
    return max(2.0 / ell, 2.0 * math.sqrt(2.0) / (ell + 1))


@dataclass(frozen=True)
class ClustMixPaperEvent(GaussianEvent):
    """Eq. 8 of the paper: μ = √(CD)/(lσ)-GDP (the final averaging only, as the paper states)."""

    cluster_size: int
    n_classes: int
    n_features: int
    sigma: float

    def __post_init__(self) -> None:
        for name in ("cluster_size", "n_classes", "n_features"):
            value = _as_int(name, getattr(self, name))
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "sigma", float(self.sigma))
        _check_sigma(self.sigma)

    @property
    def mu(self) -> float:
        return math.sqrt(self.n_classes * self.n_features) / (self.cluster_size * self.sigma)

    def delta_at(self, epsilon: float) -> float:
        """Eq. 8: δ(ε, σ, l, C, D)."""
        return gdp.delta_of(self.mu, epsilon)

    def noise(self) -> NoiseDescription:
        # cluster_size travels with the release's parameters: given sigma_max, it is the l_min
        # the calibration fixed (Algorithm 2 line 2), which the release's clustering needs.
        return _means_noise(
            self.sigma,
            paper_sensitivity(self.cluster_size, self.n_features),
            analysis={"cluster_size": self.cluster_size},
            what="every cluster's mean of records in [0, 1]^D",
        )

    def cluster_sigma(self, size: int) -> float:
        """Eq. 8's σ_t for a cluster of ``size`` ≥ l records (Algorithm 2 line 16): the σ
        that gives the same μ at that size, σ·l/size."""
        if size < self.cluster_size:
            raise ValueError(f"a cluster of {size} < l = {self.cluster_size} records")
        return self.sigma * self.cluster_size / size

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "clustmix",
            "accountant": "paper",
            "variant": "paper",
            "covers": "Eq. 8: the final noisy averaging only; the GMM clustering, cluster sizes "
            "and KIP adaptation read the data unaccounted — NOT a differential-privacy bound",
            "mu": self.mu,
            **asdict(self),
        }


@dataclass(frozen=True)
class ClustMixEvent(GaussianEvent):
    """The final noisy averaging over a fixed clustering: μ = Δ/σ-GDP with
    Δ = max(2/l, 2√2/(l + 1)). Clustering and KIP must be charged separately."""

    cluster_size: int
    sigma: float

    def __post_init__(self) -> None:
        value = _as_int("cluster_size", self.cluster_size)
        if value < 1:
            raise ValueError(f"cluster_size must be >= 1, got {value}")
        object.__setattr__(self, "cluster_size", value)
        object.__setattr__(self, "sigma", float(self.sigma))
        _check_sigma(self.sigma)

    @property
    def sensitivity(self) -> float:
        return means_sensitivity(self.cluster_size)

    @property
    def mu(self) -> float:
        return self.sensitivity / self.sigma

    def noise(self) -> NoiseDescription:
        return _means_noise(self.sigma, means_sensitivity(self.cluster_size))

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "clustmix",
            "accountant": "fixed",
            "covers": "final noisy averaging over a fixed clustering only; the data-dependent "
            "clustering and KIP steps are charged separately",
            "sensitivity": self.sensitivity,
            "mu": self.mu,
            **asdict(self),
        }


def _means_noise(
    sigma: float,
    sensitivity: float,
    analysis: Mapping[str, float] | None = None,
    what: str = "every cluster's mean of clipped records",
) -> NoiseDescription:
    # Labels are the clusters' classes (fixed by the clustering): only the means are noised.
    scale = NoiseScale("means", sigma, sensitivity, ("features",), what)
    return NoiseDescription(scales=(scale,), calibrated="means", analysis=dict(analysis or {}))


def paper(sigma: float, keys: Mapping[str, Any]) -> ClustMixPaperEvent:
    if keys.get("cluster_size") is None:
        raise ValueError("clustmix/paper needs cluster_size (l_min), or sigma_max with a target ε")
    return ClustMixPaperEvent(keys["cluster_size"], keys["n_classes"], keys["n_features"], sigma)


def prepare_paper(keys: dict[str, Any], epsilon: float, delta: float) -> dict[str, Any]:
    """Algorithm 2 line 2: given σ_max and no l, l_min = the least l at which Eq. 8 meets
    (ε, δ) with σ ≤ σ_max, i.e. ⌈√(CD)/(σ_max·μ(ε, δ))⌉, checked by the event itself (the
    closed form's rounding never decides)."""
    if keys.get("cluster_size") is not None:
        return keys
    sigma_max = keys.get("sigma_max")
    if sigma_max is None:
        raise ValueError("clustmix/paper needs cluster_size (l_min) or sigma_max")
    root = math.sqrt(keys["n_classes"] * keys["n_features"])
    ell = max(2, math.ceil(root / (sigma_max * gdp.mu_for_epsilon(epsilon, delta))))
    while ell > 2 and paper(sigma_max, {**keys, "cluster_size": ell - 1}).epsilon(delta) <= epsilon:
        ell -= 1
    while paper(sigma_max, {**keys, "cluster_size": ell}).epsilon(delta) > epsilon:
        ell += 1
    return {**keys, "cluster_size": ell}


def tight(sigma: float, keys: Mapping[str, Any]) -> ClustMixEvent:
    return ClustMixEvent(keys["cluster_size"], sigma)


def _guess(sensitivity: float, epsilon: float, delta: float) -> float:
    # μ-GDP inverted exactly: σ = Δ/μ(ε, δ).
    try:
        return sensitivity / gdp.mu_for_epsilon(epsilon, delta)
    except (ValueError, ZeroDivisionError):
        return 1.0


def guess_paper(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    if keys.get("cluster_size") is None:
        return 1.0
    return _guess(
        math.sqrt(keys["n_classes"] * keys["n_features"]) / keys["cluster_size"], epsilon, delta
    )


def guess_tight(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    return _guess(means_sensitivity(keys["cluster_size"]), epsilon, delta)
