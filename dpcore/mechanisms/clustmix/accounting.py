"""ClustMix accountants. Variant dp (every data-dependent step charged) here; the accountants
of the averaging step alone (``paper``: the paper's Eq. 8; ``fixed``: a fixed clustering), with
their derivations, in ``accounting_means``, re-exported so that one module names them all."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpcore.accounting import dpsgd
from dpcore.accounting.composition import ApproximateDPEvent, GaussianEvent
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms.clustmix.accounting_means import (
    ClustMixEvent,
    ClustMixPaperEvent,
    _as_int,
    _check_sigma,
    _guess,
    guess_paper,
    guess_tight,
    means_sensitivity,
    paper,
    paper_sensitivity,
    prepare_paper,
    tight,
)

__all__ = [
    "ClustMixDPEvent",
    "ClustMixDPKIPEvent",
    "ClustMixEvent",
    "ClustMixPaperEvent",
    "detail_share",
    "dp",
    "dp_steps",
    "guess_dp",
    "guess_paper",
    "guess_tight",
    "kip_steps",
    "means_sensitivity",
    "moment_share",
    "paper",
    "paper_sensitivity",
    "prepare_paper",
    "tight",
    "value_share",
]


# ------------------------------------------------------------------------------------------
# variant dp: every data-dependent step charged
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClustMixDPEvent(GaussianEvent):
    """ClustMix ``dp``: ``kmeans_steps`` noisy Lloyd steps (``dpcore.mechanisms.kmeans``) and
    the final step, each one Gaussian mechanism on every cluster's (sum, count) — of records of
    norm ≤ 1 with non-negative entries (before a public contraction), or, for the k-means
    steps when ``fourier``, of their random Fourier features (norm 1, both signs).

    A step with sums' std σ_s and counts' std σ_c is μ-GDP with μ² = ``kmeans.step_mu2``:
    max(2/σ_s² + 2/σ_c², r²/σ_s²), a record that moves between clusters moving two sums by
    ≤ 1 and two counts by 1, one replaced within its cluster one sum by ≤ r (r = √2 for the
    records, which never decides; r = 2 for Fourier features). The final step has sums' std
    ``sigma`` (the calibrated scale) and spends the share ``count_share`` = c of its μ² on the
    counts: μ_f² = 2/((1 − c)σ²), σ_c = σ·√((1 − c)/c). The k-means steps spend the share
    ``kmeans_share`` = s of the total μ² in equal parts: T_K·μ_k² = s·μ_f²/(1 − s). On records
    each step splits its μ² as the final one (σ_c,k = σ_s,k·√((1 − c)/c)); on Fourier features
    the counts ride free at σ_c,k = σ_s,k (2/σ² + 2/σ² = 4/σ²). The steps compose adaptively
    as GDP (Dong, Roth, Su 2019, Cor. 3.3): μ = √(μ_f² + T_K·μ_k²), converted to (ε, δ)
    exactly. With one cluster per class there are no k-means steps (T_K = 0) and μ² = μ_f²:
    the whole budget goes to the final step.

    Model gaussian (``moment_share`` = m > 0): the final step also releases every cluster's
    second-moment sums (``dpcore.mechanisms.moments``) with std σ₂, and its μ² is
    ``moments.step_mu2`` = max(2/σ_s² + 2/σ₂², 2/σ_s² + 2/σ₂² + 2/σ_c²) = 2/σ_s² + 2/σ₂² +
    2/σ_c² (a record replaced within its cluster moves its sum and second-moment block by ≤ √2
    each; one moved between clusters moves two of each by ≤ 1 and two counts by 1). The counts
    take c of it, the second moments m, the sums 1 − c − m: μ_f² = 2/((1 − c − m)σ²),
    σ_c = σ·√((1 − c − m)/c), σ₂ = σ·√((1 − c − m)/m). The k-means steps keep their own split
    (the counts' share c of each), sized against this μ_f².

    Values matched (``value_share`` = v > 0, model gaussian only): the final step also releases
    the pooled value histogram (``dpcore.mechanisms.values``), one vector whatever the
    clusters, moved by ≤ √2 by any replacement: μ_f² gains 2/σ_v² in both cases, the sums take
    1 − c − m − v, and σ_v = σ·√((1 − c − m − v)/v).

    Detail outside (``detail_share`` = e > 0, model gaussian only): the final step also releases
    the records' summed energy outside the basis (``dpcore.mechanisms.detail``), one scalar
    moved by ≤ 1 by any replacement: μ_f² gains 1/σ_e², the sums take 1 − c − m − v − e, and
    σ_e = σ·√((1 − c − m − v − e)/(2e))."""

    sigma: float
    kmeans_steps: int
    kmeans_share: float
    count_share: float
    fourier: bool = False
    moment_share: float = 0.0  # 0: model means (no second moments)
    value_share: float = 0.0  # 0: no value histogram
    detail_share: float = 0.0  # 0: no energy outside the basis

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", float(self.sigma))
        _check_sigma(self.sigma)
        steps = _as_int("kmeans_steps", self.kmeans_steps)
        if steps < 0:
            raise ValueError(f"kmeans_steps must be >= 0, got {steps}")
        object.__setattr__(self, "kmeans_steps", steps)
        for name in ("kmeans_share", "count_share"):
            value = float(getattr(self, name))
            if not 0 < value < 1:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "fourier", bool(self.fourier))
        moment = float(self.moment_share)
        if not (0 <= moment < 1 and self.count_share + moment < 1):
            raise ValueError(
                f"moment_share must be in [0, 1) with count_share + moment_share < 1, got "
                f"{moment} (count_share {self.count_share})"
            )
        object.__setattr__(self, "moment_share", moment)
        # The final step's further statistics, each a share of its μ² beside the counts' and
        # the second moments' (the sums keep the rest, so the shares must sum below 1).
        used = self.count_share + moment
        for name in ("value_share", "detail_share"):
            share = float(getattr(self, name))
            used += share
            if not (0 <= share < 1 and used < 1):
                raise ValueError(
                    f"{name} must be in [0, 1) with count_share + moment_share + value_share "
                    f"+ detail_share < 1, got {share} (the shares sum to {used:g})"
                )
            if share > 0 and moment == 0:
                raise ValueError(f"{name} needs second moments (model gaussian)")
            object.__setattr__(self, name, share)

    @property
    def second_moments(self) -> bool:
        """Model gaussian: the final step also releases second-moment sums."""
        return self.moment_share > 0

    @property
    def mu(self) -> float:
        """√(Σ of every step's μ²), from the declared noise itself."""
        from dpcore.mechanisms import detail, moments, values
        from dpcore.mechanisms.kmeans import step_mu2

        s = self.scales()
        if self.second_moments:
            total = moments.step_mu2(
                sigma_counts=s["counts"], sigma_sums=s["sums"], sigma_second=s["second"]
            )
            if "values" in s:
                total += values.SENSITIVITY**2 / s["values"] ** 2
            if "detail" in s:
                total += detail.SENSITIVITY**2 / s["detail"] ** 2
        else:
            total = step_mu2(sigma_sums=s["sums"], sigma_counts=s["counts"], fourier=False)
        if self.kmeans_steps:
            total += self.kmeans_steps * step_mu2(
                sigma_sums=s["kmeans_sums"], sigma_counts=s["kmeans_counts"], fourier=self.fourier
            )
        return math.sqrt(total)

    def scales(self) -> dict[str, float]:
        """σ of each noise: the final sums and counts (and second moments, model gaussian),
        the k-means steps' sums and counts (none without k-means steps: one cluster per
        class)."""
        c, s = self.count_share, self.kmeans_share
        ratio = math.sqrt((1 - c) / c)
        if self.second_moments:
            # The final step's sums take 1 − c − m − v − e of its μ²:
            # μ_f²·σ² = 2/(1 − c − m − v − e).
            sums_share = 1 - c - self.moment_share - self.value_share - self.detail_share
            scales = {
                "sums": self.sigma,
                "counts": self.sigma * math.sqrt(sums_share / c),
                "second": self.sigma * math.sqrt(sums_share / self.moment_share),
            }
            if self.value_share:
                scales["values"] = self.sigma * math.sqrt(sums_share / self.value_share)
            if self.detail_share:
                # Sensitivity 1, not √2: 1/σ_e² = e·μ_f² = 2e/(sums_share·σ²).
                scales["detail"] = self.sigma * math.sqrt(sums_share / (2 * self.detail_share))
            final = 2.0 / sums_share
        else:
            scales = {"sums": self.sigma, "counts": self.sigma * ratio}
            final = 2.0 / (1 - c)
        if self.kmeans_steps:
            # σ_k² = T_K·g_k·(1 − s)/(s·μ_f²), g_k the step's μ²·σ_k²: 2/(1 − c) on records,
            # 4 on Fourier features; μ_f²·σ² = ``final``.
            per_step = 4.0 if self.fourier else 2.0 / (1 - c)
            kmeans = self.sigma * math.sqrt((1 - s) * self.kmeans_steps * per_step / (s * final))
            scales.update(
                kmeans_sums=kmeans, kmeans_counts=kmeans if self.fourier else kmeans * ratio
            )
        return scales

    def noise(self) -> NoiseDescription:
        from dpcore.mechanisms.detail import SENSITIVITY as DETAIL
        from dpcore.mechanisms.kmeans import FOURIER_SUM_SENSITIVITY, SUM_ROW_SENSITIVITY
        from dpcore.mechanisms.moments import SECOND_SAME, SUM_SAME
        from dpcore.mechanisms.values import SENSITIVITY as VALUES

        sigmas = self.scales()
        kmeans_rows = FOURIER_SUM_SENSITIVITY if self.fourier else SUM_ROW_SENSITIVITY
        # Model gaussian's step (``moments.noisy_moments``) declares the within-cluster bound
        # √2 of a sum row and of a second-moment row (a moved record moves two rows by ≤ 1).
        sums_row = SUM_SAME if self.second_moments else 1.0
        what = {
            "sums": ("features", "every final cluster's sum of records", sums_row),
            "counts": ("counts", "every final cluster's record count", 1.0),
            "second": (
                "features",
                "every final cluster's second-moment sums Σ z zᵀ over the first moment_dim "
                "basis coordinates (upper triangle, off-diagonal × √2)",
                SECOND_SAME,
            ),
            "values": (
                "features",
                "the histogram of every record's feature values (256 levels, pooled over the "
                "features, each record weighing 1)",
                VALUES,
            ),
            "detail": (
                "features",
                "the records' summed energy outside the basis, Σ‖u − B Bᵀu‖² (each term in [0, 1])",
                DETAIL,
            ),
            "kmeans_sums": (
                "centres",
                "every cluster's sum "
                + ("of random Fourier features " if self.fourier else "")
                + "at each DP k-means step",
                kmeans_rows,
            ),
            "kmeans_counts": ("centres", "every cluster's count at each DP k-means step", 1.0),
        }
        scales = tuple(
            NoiseScale(name, sigmas[name], what[name][2], (what[name][0],), what[name][1])
            for name in what
            if name in sigmas
        )
        return NoiseDescription(scales=scales, calibrated="sums")

    def describe(self) -> dict[str, Any]:
        fields = asdict(self)
        covers = (
            "every data-dependent step: DP k-means (noisy sums and counts per step), "
            "the final noisy sums and counts; Gaussian mechanisms composed as GDP"
        )
        if self.second_moments:
            covers = covers.replace(
                "the final noisy sums and counts",
                "the final noisy sums, counts and second-moment sums"
                + (" and the value histogram" if self.value_share else "")
                + (" and the energy outside the basis" if self.detail_share else ""),
            )
        else:
            del fields["moment_share"]
        if not self.value_share:
            del fields["value_share"]
        if not self.detail_share:
            del fields["detail_share"]
        return {
            "mechanism": "clustmix",
            "accountant": "tight",
            "variant": "dp",
            "covers": covers,
            "mu": self.mu,
            "noise": self.scales(),
            **fields,
        }


@dataclass(frozen=True)
class ClustMixDPKIPEvent(ApproximateDPEvent):
    """ClustMix ``dp`` with DP-KIP: the Gaussian steps of ``gaussian`` (a ``ClustMixDPEvent``)
    and ``kip_steps`` DP-SGD steps on the KIP loss. Every record enters a step's batch
    independently with probability q = ``kip_batch``/n, its per-record gradient (a function of
    that record and the public centres) is clipped to norm C, and the batch's sum gets
    N(0, (z·C)²) per coordinate: whitened, one record's presence moves the release by ≤ 1/z and
    its replacement by ≤ 2/z. ``dpcore.accounting.dpsgd`` proves such a step dominated, at every
    γ and in both orders, by its two-term pair with a = 1/z, Δ = 2/z (or the simpler symmetric
    pair (P*, Q*) of ``dpcore.accounting.pld``, p = q, distance 2/z); no assumption that
    antipodal gradients are the worst case.
    The centres each step moves are public (earlier noisy outputs), so the steps compose
    adaptively; with the Gaussian part, μ_G-GDP as (N(0, 1), N(μ_G, 1)), the product pair
    dominates the release (Zhu, Dong, Wang 2022, Thm 10), and its pessimistic PLD gives the ε.

    z follows from σ and the share ``kip_share`` = κ of the nominal μ²: the KIP part is given
    μ_kip² = κ·μ_G²/(1 − κ), and z solves the central-limit approximation of T steps of that
    pair, μ_kip² = q²·T·(e^{Δ̄²} − 1) = q²·T·(e^{4/z²} − 1) (Bu, Dong, Long, Su 2020). The
    approximation only splits the budget; the ε is the PLD's."""

    gaussian: ClustMixDPEvent
    n: int
    kip_steps: int
    kip_batch: int
    kip_share: float

    def __post_init__(self) -> None:
        n = _as_int("n", self.n)
        steps = _as_int("kip_steps", self.kip_steps)
        batch = _as_int("kip_batch", self.kip_batch)
        if n < 1 or steps < 1 or not 1 <= batch <= n:
            raise ValueError(
                f"need n >= 1, kip_steps >= 1, 1 <= kip_batch <= n; got {n}, {steps}, {batch}"
            )
        share = float(self.kip_share)
        if not 0 < share < 1:
            raise ValueError(f"kip_share must be in (0, 1), got {share}")
        for name, value in (("n", n), ("kip_steps", steps), ("kip_batch", batch)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "kip_share", share)

    @property
    def sigma(self) -> float:
        return self.gaussian.sigma

    @property
    def q(self) -> float:
        return self.kip_batch / self.n

    @property
    def kip_noise_multiplier(self) -> float:
        """z of every DP-KIP step (class docstring)."""
        mu_kip2 = self.kip_share * self.gaussian.mu**2 / (1 - self.kip_share)
        return 2.0 / math.sqrt(math.log1p(mu_kip2 / (self.q**2 * self.kip_steps)))

    @property
    def sampling_prob(self) -> float:
        """q⁺: ``kip_batch``/n rounded up (the sampler's rate is exactly that fraction)."""
        return dpsgd.rate(self.kip_batch, self.n)

    @property
    def kip_distance(self) -> float:
        """Δ̄ = 2/z of one DP-KIP step's proven pair (presence 1/z, replacement 2/z)."""
        z = self.kip_noise_multiplier
        return dpsgd.distance(1.0 / z, 2.0 / z)

    def epsilon(self, delta: float) -> float:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        return _kip_epsilon(self, delta)

    def scales(self) -> dict[str, float]:
        return {**self.gaussian.scales(), "kip": self.kip_noise_multiplier}

    def noise(self) -> NoiseDescription:
        base = self.gaussian.noise()
        kip = NoiseScale(
            "kip",
            self.kip_noise_multiplier,
            2.0,
            ("centres",),
            "every DP-KIP step: the Poisson batch's sum of per-record KIP-loss gradients, "
            "each clipped to norm C (σ in units of C)",
        )
        return NoiseDescription(scales=(*base.scales, kip), calibrated="sums")

    def describe(self) -> dict[str, Any]:
        return {
            **self.gaussian.describe(),
            "covers": "every data-dependent step: DP k-means (noisy sums and counts per step), "
            "DP-KIP (Poisson-subsampled Gaussian DP-SGD steps), the final noisy sums and "
            "counts (and, with model gaussian, second-moment sums and the values' histogram); "
            "the Gaussian steps as one GDP Gaussian, composed with the DP-KIP steps' "
            "proven replace-one dominating pair by pessimistic PLDs",
            "q": self.q,
            "kip_steps": self.kip_steps,
            "kip_batch": self.kip_batch,
            "kip_share": self.kip_share,
            "kip_noise_multiplier": self.kip_noise_multiplier,
            "kip_step_distance": self.kip_distance,
            "noise": self.scales(),
        }


@functools.lru_cache(maxsize=1024)
def _kip_epsilon(event: ClustMixDPKIPEvent, delta: float) -> float:
    # Calibration, preview and admission ask again for the same event.
    z = event.kip_noise_multiplier
    return dpsgd.epsilon(
        sampling_prob=event.sampling_prob,
        present=1.0 / z,
        replaced=2.0 / z,
        steps=event.kip_steps,
        delta=delta,
        gaussian_mu=event.gaussian.mu,
    )


def dp_steps(keys: Mapping[str, Any]) -> int:
    """T_K: the k-means steps of a dp release (initial sums, splits, refinements)."""
    from dpcore.mechanisms.kmeans import kmeans_steps

    return kmeans_steps(
        _as_int("clusters_per_class", keys["clusters_per_class"]), keys["kmeans_refine"]
    )


def _gaussian(sigma: float, keys: Mapping[str, Any]) -> ClustMixDPEvent:
    return ClustMixDPEvent(
        sigma,
        dp_steps(keys),
        keys["kmeans_share"],
        keys["count_share"],
        fourier=keys.get("feature_map", "none") == "rff",
        moment_share=moment_share(keys),
        value_share=value_share(keys),
        detail_share=detail_share(keys),
    )


def moment_share(keys: Mapping[str, Any]) -> float:
    """The final step's μ² share on second moments: ``moment_share`` with model gaussian, 0
    (none released) with model means."""
    if keys.get("model", "means") != "gaussian":
        return 0.0
    return float(keys["moment_share"])


def value_share(keys: Mapping[str, Any]) -> float:
    """The final step's μ² share on the value histogram: ``value_share`` with model gaussian
    and values matched, else 0 (none released)."""
    if moment_share(keys) == 0 or keys.get("values", "model") != "matched":
        return 0.0
    return float(keys["value_share"])


def detail_share(keys: Mapping[str, Any]) -> float:
    """The final step's μ² share on the energy outside the basis: ``detail_share`` with model
    gaussian and detail outside, else 0 (none released)."""
    if moment_share(keys) == 0 or keys.get("detail", "none") != "outside":
        return 0.0
    return float(keys["detail_share"])


def kip_steps(keys: Mapping[str, Any]) -> int:
    """DP-KIP steps a dp release runs: none without k-means (one cluster per class: nothing
    to adapt, the release refuses the request)."""
    return int(keys.get("dpkip_steps") or 0) if dp_steps(keys) else 0


def dp(sigma: float, keys: Mapping[str, Any]) -> ClustMixDPEvent | ClustMixDPKIPEvent:
    gaussian = _gaussian(sigma, keys)
    steps = kip_steps(keys)
    if not steps:
        return gaussian
    if keys.get("n") is None:
        raise ValueError("clustmix/tight with dpkip_steps needs n (DP-KIP's rate q = batch/n)")
    return ClustMixDPKIPEvent(gaussian, keys["n"], steps, keys["dpkip_batch"], keys["dpkip_share"])


def guess_dp(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
    # σ·μ of the Gaussian part (μ ∝ 1/σ); with DP-KIP, its share of μ² is set aside.
    factor = _gaussian(1.0, keys).mu
    if kip_steps(keys):
        factor /= math.sqrt(1 - keys["dpkip_share"])
    return _guess(factor, epsilon, delta)
