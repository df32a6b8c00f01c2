"""Per-cluster Gaussian models from noisy first and second moments in a public basis, sampled
into in-domain records.

Records x are rows scaled to [0, 1] per feature by the declared range (non-negative), clipped to
L2 norm ≤ C (``clip``) and divided by C: unit rows u = x/C, ‖u‖ ≤ 1, u ≥ 0. They are projected
on a public basis with orthonormal columns B (d × k; ``dpcore.mechanisms.basis``): z = Bᵀu, a
contraction, so ‖z‖ ≤ 1 and ‖z − z′‖ ≤ ‖u − u′‖ ≤ √2 (u, u′ ≥ 0 gives u·u′ ≥ 0, so
‖u − u′‖² = ‖u‖² + ‖u′‖² − 2u·u′ ≤ 2; the projected z may take both signs, but the bound is
inherited from the unprojected rows).

Each record belongs to one cluster, a function of the record alone (its class, and its nearest
public centre of that class: one per class, or centres from DP k-means, ``kmeans.dp_kmeans``,
whose steps are charged in the same GDP total). Per cluster c the release draws

- the count N_c + N(0, σ_c²),
- the sum S1_c = Σ z + N(0, σ₁² I_k),
- the second-moment sum S2_c = Σ z_h z_hᵀ over the first h ≤ k coordinates z_h (``second_dim``),
  stored as its upper triangle with the off-diagonal entries × √2 (``triangle``), so that the
  vector's L2 norm is the matrix's Frobenius norm, followed (``tail``) by the diagonal
  Σ z_i² of the coordinates past h, + N(0, σ₂²) on every entry. Either way the block is a
  subset of the entries of triangle(z zᵀ) over all k coordinates, so its changes are bounded
  by that full triangle's (below). With ``pooled`` the second-moment block is one sum over
  all records instead of one per cluster (a within-cluster covariance shared by all clusters:
  its noise is over n, not N_c); a moved record then changes it by z′z′ᵀ − zzᵀ (≤ √2), and the
  step's μ² is the same 2/σ₁² + 2/σ₂² + 2/σ_c² (below).

Sensitivity (replace-one, n public, a record may change cluster and class). For vectors a, b:
‖aaᵀ − bbᵀ‖_F² = tr((aaᵀ − bbᵀ)²) = ‖a‖⁴ + ‖b‖⁴ − 2(a·b)² ≤ ‖a‖⁴ + ‖b‖⁴, whatever the sign of
a·b. With ‖a‖, ‖b‖ ≤ 1:

- same cluster (x → x′ both in c): S1_c moves by z′ − z (≤ √2, ``SUM_SAME``), S2_c by
  z′z′ᵀ − zzᵀ (≤ √2, ``SECOND_SAME``), no count: μ² ≤ 2/σ₁² + 2/σ₂², attained by orthogonal
  unit rows (in the identity basis: e₁ → e₂);
- moved (x in A, x′ in B ≠ A): S1_A by −z and S1_B by +z′ (each ≤ 1, ``SUM_MOVED``), S2_A and
  S2_B by −zzᵀ and +z′z′ᵀ (each ≤ 1, ``SECOND_MOVED``), N_A and N_B by ∓1: μ² ≤ 2/σ₁² + 2/σ₂² +
  2/σ_c², attained by any two unit rows in different clusters.

So the final step is μ-GDP with μ² = max(same, moved) = 2/σ₁² + 2/σ₂² + 2/σ_c² (``step_mu2``);
DP k-means steps add 2/σ_s² + 2/σ_kc² each (``kmeans.step_mu2``); adaptive steps compose as
GDP (√Σμ²), converted to (ε, δ) by ``dpcore.accounting.gdp``. ``calibrate`` finds the smallest
base σ meeting a target ε with ``dpcore.calibration.smallest_noise`` (never above the target).

Everything after the noisy outputs is post-processing: per cluster, mean m = S1/N,
covariance Σ = S2/N − m_h m_hᵀ (symmetrised), shrunk toward its diagonal (or isotropic) target
with a weight computed from the noise scales, h and the noisy count only (``fit``; the diagonal
target's variances themselves shrunk alike toward all clusters' count-weighted variances),
eigenvalues floored; n rows (n public) drawn ∝ noisy counts from N(m, Σ) (coordinates past h
at the mean), mapped back (C·B z), clipped to [0, 1], labelled with their cluster's class.

Written by hand: no library releases noisy second moments per cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from dpcore.accounting import gdp
from dpcore.calibration import smallest_noise
from dpcore.mechanisms import float_error, kmeans, segments
from dpcore.mechanisms.apportion import apportion
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom

# Replace-one sensitivities of one cluster's blocks, for unit rows (‖z‖ ≤ 1, non-negative
# before the basis); multiply by C (sums) and C² (second moments) for rows of norm ≤ C.
SUM_SAME = math.sqrt(2.0)  # ‖z′ − z‖, both in one cluster
SUM_MOVED = 1.0  # ‖z‖: each of the two clusters a moved record leaves / joins
SECOND_SAME = math.sqrt(2.0)  # ‖z′z′ᵀ − zzᵀ‖_F ≤ √(‖z‖⁴ + ‖z′‖⁴)
SECOND_MOVED = 1.0  # ‖zzᵀ‖_F = ‖z‖²
COUNT_MOVED = 1.0

Shrink = Literal["diagonal", "isotropic"]


def step_mu2(*, sigma_counts: float, sigma_sums: float, sigma_second: float) -> float:
    """μ² of the moments step: the worse of a record replaced within its cluster and one moved
    between two clusters (module docstring)."""
    same = SUM_SAME**2 / sigma_sums**2 + SECOND_SAME**2 / sigma_second**2
    moved = 2.0 * (
        SUM_MOVED**2 / sigma_sums**2
        + SECOND_MOVED**2 / sigma_second**2
        + COUNT_MOVED**2 / sigma_counts**2
    )
    return max(same, moved)


def triangle(matrices: torch.Tensor) -> torch.Tensor:
    """(..., h, h) symmetric → (..., h(h+1)/2): the upper triangle, off-diagonal entries × √2
    (L2 norm of the result = Frobenius norm of the matrix)."""
    h = matrices.shape[-1]
    i, j = torch.triu_indices(h, h, device=matrices.device)
    weight = torch.where(i == j, 1.0, math.sqrt(2.0)).to(matrices.dtype)
    return matrices[..., i, j] * weight


def untriangle(vectors: torch.Tensor, h: int) -> torch.Tensor:
    """The inverse of ``triangle``: a symmetric (..., h, h)."""
    i, j = torch.triu_indices(h, h, device=vectors.device)
    weight = torch.where(i == j, 1.0, math.sqrt(2.0)).to(vectors.dtype)
    out = torch.zeros((*vectors.shape[:-1], h, h), dtype=vectors.dtype, device=vectors.device)
    values = vectors / weight
    out[..., i, j] = values
    out[..., j, i] = values
    return out


@dataclass(frozen=True)
class Shares:
    """How the total μ² is split: counts, sums, second moments (the final step) and DP k-means
    (its steps share equally, ``kmeans_count`` of each step on the counts). Normalised."""

    counts: float = 0.1
    sums: float = 0.45
    second: float = 0.45
    kmeans: float = 0.0
    kmeans_count: float = 0.2

    def normalised(self) -> Shares:
        total = self.counts + self.sums + self.second + self.kmeans
        return Shares(
            self.counts / total,
            self.sums / total,
            self.second / total,
            self.kmeans / total,
            self.kmeans_count,
        )


@dataclass(frozen=True)
class Scales:
    """Noise stds, unit rows: the final step's and each DP k-means step's."""

    counts: float
    sums: float
    second: float
    kmeans_steps: int = 0
    kmeans: kmeans.StepNoise | None = None

    def mu2(self) -> float:
        total = step_mu2(sigma_counts=self.counts, sigma_sums=self.sums, sigma_second=self.second)
        if self.kmeans_steps:
            assert self.kmeans is not None
            total += self.kmeans_steps * kmeans.step_mu2(
                sigma_sums=self.kmeans.sums, sigma_counts=self.kmeans.counts, fourier=False
            )
        return total


def scales(sigma: float, shares: Shares, kmeans_steps: int) -> Scales:
    """The stds from one base σ: a component with share s of the total contributes s·2/σ²
    (so the total μ² is 2/σ² — ``Scales.mu2`` recomputes it from the stds themselves)."""
    s = shares.normalised()
    step = None
    steps = kmeans_steps if s.kmeans > 0 else 0
    if steps:
        per_step = s.kmeans / steps
        step = kmeans.StepNoise(
            sums=sigma / math.sqrt(per_step * (1.0 - s.kmeans_count)),
            counts=sigma / math.sqrt(per_step * s.kmeans_count),
        )
    return Scales(
        counts=sigma / math.sqrt(s.counts),
        sums=sigma / math.sqrt(s.sums),
        second=sigma / math.sqrt(s.second),
        kmeans_steps=steps,
        kmeans=step,
    )


def calibrate(epsilon: float, delta: float, shares: Shares, kmeans_steps: int) -> Scales:
    """The smallest base σ whose composed GDP μ gives ε ≤ ``epsilon`` at ``delta``."""

    def epsilon_of(sigma: float) -> float:
        return gdp.epsilon_of(math.sqrt(scales(sigma, shares, kmeans_steps).mu2()), delta)

    sigma, _ = smallest_noise(epsilon_of, epsilon, initial=10.0)
    return scales(sigma, shares, kmeans_steps)


def unit_rows(x: torch.Tensor, clip: float) -> torch.Tensor:
    """Rows in [0, 1] clipped to L2 norm ≤ ``clip`` and divided by it: norm ≤ 1, float64."""
    x = x.double().clamp(0.0, 1.0)
    norms = x.norm(dim=1, keepdim=True)
    return x * (1.0 / torch.clamp(norms, min=clip))


@dataclass
class NoisyMoments:
    """The released statistics, unit rows: counts (m,), sums (m, k), second-moment triangles
    (m, h(h+1)/2), and each cluster's class (m,)."""

    counts: torch.Tensor
    sums: torch.Tensor
    second: torch.Tensor
    groups: torch.Tensor
    second_dim: int
    tail: bool = False
    pooled: bool = False


def _errors(basis: Basis, n: int, k: int) -> tuple[float, float]:
    """Float error bounds, beyond the sensitivities, of the computed sums and second-moment
    sums of neighbours (unit rows; see kmeans/basis for the sum's part). A row's computed
    projection is off by e ≤ ``basis.excess(1, 1)``; its outer product then by ≤ 2e + e² plus
    one rounding per entry (≤ u·‖z‖² in Frobenius norm), twice for a pair."""
    return step_errors(basis.excess(1.0, 1.0), n)


def step_errors(e: float, n: int, stored: float = 0.0) -> tuple[float, float]:
    """``_errors`` for a row excess ``e`` the caller bounds (e.g. ``basis.excess`` of float32
    inputs): the sums' and the second-moment sums' float error over ``n`` records. ``stored``:
    the relative excess of the stored rows' norms (``float_error.INPUT_RELATIVE`` for float32
    inputs): rows of norm ≤ 1 + r have outer products of norm ≤ (1 + r)², so a pair's
    second-moment change passes √2 by ≤ √2·(2r + r²), added here in full."""
    sums = float_error.scaled_sum(SUM_SAME, terms=n, magnitude=float(n)) + 2.0 * e
    outer = 2.0 * e + e * e + 2.0**-53
    second = float_error.scaled_sum(SECOND_SAME, terms=n, magnitude=float(n)) + 2.0 * outer
    second += SECOND_SAME * (2.0 * stored + stored * stored)
    return sums, second


def noisy_moments(
    Z: torch.Tensor,
    assignment: torch.Tensor,
    groups: torch.Tensor,
    *,
    second_dim: int,
    tail: bool = False,
    pooled: bool = False,
    scales: Scales,
    sampler: NoiseSampler,
    errors: tuple[float, float] = (0.0, 0.0),
    chunk: int = 4096,
) -> NoisyMoments:
    """Every cluster's noisy count, sum and second-moment sum (module docstring). ``Z`` (n, k)
    float64 unit rows in the basis; ``assignment`` (n,) each record's cluster (−1: none);
    ``groups`` (m,) each cluster's class. ``chunk`` records' outer products at a time (memory
    ≈ chunk·h²·16 bytes). The released statistics come back on the CPU."""
    m, k, h = int(groups.shape[0]), Z.shape[1], second_dim
    device = Z.device
    # Every record is summed (those of no cluster into an extra row, dropped): the work never
    # depends on how many records have a cluster (segments.outside).
    index, rows = segments.outside(assignment, m), Z.double()
    counts = torch.zeros((m + 1, 1), dtype=torch.float64, device=device)
    ones = torch.ones((index.shape[0], 1), dtype=torch.float64, device=device)
    counts = segments.segment_sum(counts, index, ones)[:m]
    sums = segments.segment_sum(
        torch.zeros((m + 1, k), dtype=torch.float64, device=device), index, rows
    )[:m]
    head = rows[:, :h]
    width = h * (h + 1) // 2 + (k - h if tail else 0)
    second = torch.zeros((2 if pooled else m + 1, width), dtype=torch.float64, device=device)
    second_index = torch.where(index < m, 0, 1) if pooled else index
    for start in range(0, head.shape[0], chunk):
        part = head[start : start + chunk]
        block = triangle(part[:, :, None] * part[:, None, :])
        if tail:
            block = torch.cat([block, rows[start : start + chunk, h:] ** 2], dim=1)
        segments.segment_sum(second, second_index[start : start + chunk], block)
    second = second[:1] if pooled else second[:m]
    noisy_counts = sampler(counts, sigma=scales.counts, sensitivity=COUNT_MOVED)[:, 0]
    noisy_sums = sampler(
        sums, sigma=scales.sums, sensitivity=SUM_SAME, error=errors[0], unit=SUM_MOVED
    )
    noisy_second = sampler(
        second, sigma=scales.second, sensitivity=SECOND_SAME, error=errors[1], unit=SECOND_MOVED
    )
    return NoisyMoments(
        noisy_counts.double().cpu(),
        noisy_sums.double().cpu(),
        noisy_second.double().cpu(),
        groups.cpu(),
        h,
        tail,
        pooled,
    )


def survivors(
    stats: NoisyMoments,
    *,
    drop_below: float,
    sigma_counts: float,
    pad_lost_groups: bool = False,
) -> NoisyMoments:
    """The clusters kept (``kmeans.pools``, at the counts' noise): a merged cluster's noisy
    counts, sums and second-moment sums are added. Per-cluster statistics only (not
    ``pooled``).

    ``pad_lost_groups``: a group (class) none of whose clusters is kept is kept all the same,
    as one cluster whose statistics are its own noisy ones plus τ pseudo-records at every
    record's noisy mean and second moment (τ: the keep threshold, ``kmeans.drop_threshold``;
    its count max(noisy count, 0) + τ). So a class too small to see at this noise still gets
    rows, shrunk toward the data's overall distribution (an estimator with a prior count:
    post-processing of the noisy statistics), where otherwise it would vanish from the
    release."""
    if stats.pooled:
        raise ValueError("survivors merges per-cluster second moments: not with pooled")
    keep, merged = kmeans.pools(
        stats.counts, stats.groups, drop_below=drop_below, sigma_counts=sigma_counts
    )
    counts, sums, second, groups = (
        [stats.counts[keep]],
        [stats.sums[keep]],
        [stats.second[keep]],
        [stats.groups[keep]],
    )
    for small in merged:
        counts.append(stats.counts[small].sum()[None])
        sums.append(stats.sums[small].sum(dim=0, keepdim=True))
        second.append(stats.second[small].sum(dim=0, keepdim=True))
        groups.append(stats.groups[small][:1])
    if pad_lost_groups:
        present = torch.cat(groups)
        pad = kmeans.drop_threshold(drop_below, sigma_counts)
        total = stats.counts.sum().clamp_min(1.0)
        overall_sum = stats.sums.sum(dim=0, keepdim=True) / total
        overall_second = stats.second.sum(dim=0, keepdim=True) / total
        for g in torch.unique(stats.groups).tolist():
            if bool((present == g).any()):
                continue
            mine = stats.groups == g
            counts.append(stats.counts[mine].sum().clamp_min(0.0)[None] + pad)
            sums.append(stats.sums[mine].sum(dim=0, keepdim=True) + pad * overall_sum)
            second.append(stats.second[mine].sum(dim=0, keepdim=True) + pad * overall_second)
            groups.append(stats.groups[mine][:1])
    return NoisyMoments(
        torch.cat(counts),
        torch.cat(sums),
        torch.cat(second),
        torch.cat(groups),
        stats.second_dim,
        stats.tail,
        stats.pooled,
    )


@dataclass(frozen=True)
class FitOptions:
    """Post-processing knobs: the shrinkage target, a multiplier on the automatic weight (or a
    fixed weight), the eigenvalue floor (unit-row variance), and a temperature scaling the
    covariance when sampling."""

    shrink: Shrink = "diagonal"
    shrink_scale: float = 1.0
    shrink_fixed: float | None = None
    floor: float = 1e-6
    temperature: float = 1.0
    min_count: float = 1.0
    # The diagonal target's variances shrunk toward all clusters' count-weighted variances
    # (known-noise weight): with few records per cluster the noise of each variance (σ₂/N) can
    # exceed the variance itself, while the pooled ones carry the noise of all N records.
    shrink_diagonal: bool = True


@dataclass
class Model:
    """Per cluster: mean (m, k), covariance factor (m, h, h) (Σ = L Lᵀ), weight (m,), class."""

    means: torch.Tensor
    factors: torch.Tensor
    tail_std: torch.Tensor  # (m, k − h): std of each coordinate past h (0 without a tail)
    weights: torch.Tensor
    groups: torch.Tensor
    shrink_weights: list[float] = field(default_factory=list)


def fit(stats: NoisyMoments, scales: Scales, options: FitOptions) -> Model:
    """Gaussians from the noisy moments (post-processing: noisy outputs, σ's and h only).

    Shrinkage: the noise in Σ̂ = S2/N − m mᵀ has expected squared Frobenius norm
    E ≈ (σ₂/N)²·h(h+1)/2 (the triangle's entries), of which (σ₂/N)²·h(h−1)/2 off the diagonal,
    plus the mean's noise through m mᵀ (≈ 2‖m‖²·(σ₁/N)²). The weight toward the target T is
    λ = min(1, E_T / ‖Σ̂ − T‖_F²), E_T the noise energy outside T (off-diagonal for the diagonal
    target, all for the isotropic one): Ledoit–Wolf's form with the noise variance known."""
    h = stats.second_dim
    keep = stats.counts >= options.min_count
    counts = stats.counts[keep]
    means = stats.sums[keep] / counts[:, None]
    head = h * (h + 1) // 2
    k = means.shape[1]
    mh = means[:, :h]
    if stats.pooled:
        # One within-cluster covariance: S2/N − Σ_c w_c m_c m_cᵀ, w_c = N_c/N (noisy counts).
        total = torch.clamp(counts, min=0.0).sum()
        w = torch.clamp(counts, min=0.0) / total
        pooled = untriangle(stats.second[0, :head], h) / total
        pooled = pooled - (w[:, None, None] * mh[:, :, None] * mh[:, None, :]).sum(0)
        cov = pooled.expand(means.shape[0], h, h).clone()
        noise_counts = total.expand(means.shape[0])
        if stats.tail and k > h:
            tail_var = stats.second[0, head:] / total - (w[:, None] * means[:, h:] ** 2).sum(0)
            var = tail_var.expand(means.shape[0], k - h)
    else:
        second = untriangle(stats.second[keep, :head], h) / counts[:, None, None]
        cov = second - mh[:, :, None] * mh[:, None, :]
        noise_counts = counts
        if stats.tail and k > h:
            var = stats.second[keep, head:] / counts[:, None] - means[:, h:] ** 2
    tail_std = torch.zeros((means.shape[0], k - h), dtype=torch.float64)
    if stats.tail and k > h:
        # Past h: independent coordinates, variance S2_i/N − m_i², shrunk toward the cluster's
        # mean tail variance with the same known-noise weight, floored.
        for c in range(var.shape[0]):
            v = var[c]
            target = torch.clamp(v.mean(), min=options.floor)
            noise = (k - h) * (scales.second / float(noise_counts[c])) ** 2
            lam = _weight(v, target, noise, options.shrink_scale)
            shrunk = (1 - lam) * v + lam * target
            tail_std[c] = (torch.clamp(shrunk, min=options.floor) * options.temperature).sqrt()
    cov = (cov + cov.transpose(1, 2)) / 2
    factors, lambdas = [], []
    # Every cluster's variances weighted by its noisy count: the same coordinates' spread with
    # the noise of all N records rather than one cluster's.
    weight = torch.clamp(counts, min=0.0)
    pooled_diagonal = (weight[:, None] * torch.diagonal(cov, dim1=1, dim2=2)).sum(0) / max(
        float(weight.sum()), 1.0
    )
    # The pooled variances' noise std (per entry: the second moments' noise over all records),
    # capped by their mean.
    pooled_noise = scales.second / max(float(weight.sum()), 1.0)
    pooled_level = min(pooled_noise, max(float(pooled_diagonal.mean()), 0.0))
    for c in range(cov.shape[0]):
        sigma_entry = scales.second / float(noise_counts[c])
        mean_noise = 2.0 * float((mh[c] ** 2).sum()) * (scales.sums / float(counts[c])) ** 2
        S = cov[c]
        if options.shrink == "diagonal":
            d = torch.diagonal(S)
            if options.shrink_diagonal:
                toward = _weight(d, pooled_diagonal, sigma_entry**2 * h, options.shrink_scale)
                d = (1 - toward) * d + toward * pooled_diagonal
                # A variance the noise drove near zero would leave the class's samples nearly
                # constant along that coordinate (which trees read as a perfect, spurious
                # split): at least half the pooled variance, itself taken as at least the
                # noise std of its estimate (below that, zero and the truth cannot be told
                # apart), but no more than the mean pooled variance.
                d = torch.maximum(d, 0.5 * torch.clamp(pooled_diagonal, min=pooled_level))
            target = torch.diag(torch.clamp(d, min=options.floor))
            noise = sigma_entry**2 * h * (h - 1) / 2 + mean_noise * (h - 1) / h
        else:
            target = torch.eye(h, dtype=S.dtype) * max(float(torch.trace(S)) / h, options.floor)
            noise = sigma_entry**2 * h * (h + 1) / 2 + mean_noise
        if options.shrink_fixed is not None:
            lam = options.shrink_fixed
        else:
            lam = _weight(S, target, noise, options.shrink_scale)
        shrunk = (1 - lam) * S + lam * target
        values, vectors = torch.linalg.eigh(shrunk)
        values = torch.clamp(values, min=options.floor) * options.temperature
        factors.append(vectors * values.sqrt()[None, :])
        lambdas.append(lam)
    return Model(
        means,
        torch.stack(factors) if factors else torch.zeros((0, h, h), dtype=torch.float64),
        tail_std,
        torch.clamp(counts, min=0.0),
        stats.groups[keep],
        lambdas,
    )


def _weight(x: torch.Tensor, target: torch.Tensor, noise: float, scale: float) -> float:
    """The known-noise shrinkage weight of ``x`` toward ``target``: min(1, scale·noise/gap), gap
    the squared distance between them, ``noise`` the expected squared noise of x's entries
    (Ledoit–Wolf's form with the noise variance known; 1 when they coincide)."""
    gap = float(((x - target) ** 2).sum())
    return 1.0 if gap <= 0 else min(1.0, scale * noise / gap)


def sample(
    model: Model, n: int, generator: SecureRandom, second_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """n unit rows in the basis (n, k) ∝ the clusters' noisy counts, and their classes."""
    k = int(model.means.shape[1])
    if not float(model.weights.sum()) > 0:
        # No cluster's noisy count survived: nothing to sample from.
        return torch.zeros((0, k), dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
    per = apportion(model.weights.numpy(), n)
    rows, labels = [], []
    h = second_dim
    for c, count in enumerate(per.tolist()):
        if count == 0:
            continue
        z = model.means[c].repeat(count, 1)
        g = generator.normal((count, h))
        z[:, :h] += g @ model.factors[c].T
        if model.tail_std.shape[1]:
            z[:, h:] += generator.normal((count, model.tail_std.shape[1])) * model.tail_std[c]
        rows.append(z)
        labels.append(torch.full((count,), int(model.groups[c]), dtype=torch.int64))
    return torch.cat(rows), torch.cat(labels)


def decode(
    Z: torch.Tensor,
    basis: Basis,
    clip: float,
    contrast: float = 1.0,
    detail: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Unit rows in the basis → features in [0, 1]: C·(B z + ``detail``, if given), its contrast
    around 1/2 scaled by ``contrast`` (1: unchanged; a public choice), clipped."""
    x = basis.lift(Z, torch.float64)
    x = (x if detail is None else detail(x)) * clip
    if contrast != 1.0:
        x = (x - 0.5) * contrast + 0.5
    return x.clamp(0.0, 1.0)


@dataclass(frozen=True)
class Options:
    clip: float = 10.0
    second_dim: int | None = None  # h; None: all k
    tail: bool = False  # also the diagonal second moments past h
    pooled: bool = False  # one second-moment sum over all records (shared covariance)
    clusters: int = 1  # per class
    refine: int = 2
    drop_below: float = 3.0
    contrast: float = 1.0
    shares: Shares = Shares()
    fit: FitOptions = FitOptions()


def release(
    X01: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    basis: Basis,
    *,
    epsilon: float,
    delta: float,
    options: Options,
    sampler: NoiseSampler,
    generator: SecureRandom,
    n_out: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The whole mechanism: ``X01`` (n, d) in [0, 1], ``labels`` (n,) → released rows in
    [0, 1] (n_out × d), their classes, and a description (σ's, μ, ε)."""
    n = int(X01.shape[0])
    U = unit_rows(X01, options.clip)
    Z = basis.project(U)
    k = int(Z.shape[1])
    h = min(options.second_dim or k, k)
    steps = kmeans.kmeans_steps(options.clusters, options.refine)
    noise = calibrate(epsilon, delta, options.shares, steps)
    sum_error, second_error = _errors(basis, n, k)
    if noise.kmeans_steps:
        assert noise.kmeans is not None
        centres = kmeans.dp_kmeans(
            Z,
            labels,
            n_classes,
            clusters=options.clusters,
            refine=options.refine,
            noise=noise.kmeans,
            sampler=sampler,
            generator=generator,
            error=sum_error,
            drop_below=options.drop_below,
            chunk=65536,
        )
        assignment = kmeans.assign(Z, labels, centres, chunk=65536)
        groups = centres.groups
    else:
        assignment = labels.clone()
        groups = torch.arange(n_classes)
    stats = noisy_moments(
        Z,
        assignment,
        groups,
        second_dim=h,
        tail=options.tail,
        pooled=options.pooled,
        scales=noise,
        sampler=sampler,
        errors=(sum_error, second_error),
    )
    model = fit(stats, noise, options.fit)
    Zs, ys = sample(model, n_out or n, generator, h)
    X = decode(Zs, basis, options.clip, options.contrast)
    mu = math.sqrt(noise.mu2())
    info: dict[str, Any] = {
        "sigma_counts": noise.counts,
        "sigma_sums": noise.sums,
        "sigma_second": noise.second,
        "kmeans_steps": noise.kmeans_steps,
        "mu": mu,
        "epsilon": gdp.epsilon_of(mu, delta),
        "clusters": int(model.means.shape[0]),
        "shrink": [round(v, 3) for v in model.shrink_weights],
    }
    return X.numpy(), ys.numpy(), info
