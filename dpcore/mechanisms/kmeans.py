"""DP k-means: Lloyd steps whose only reads of the data are noisy per-cluster sums and counts.

One implementation for every mechanism that clusters privately (ClustMix's ``dp`` variant; DPGM's
kernel k-means runs it on random Fourier features).

Privacy, per step (docs/privacy.md, "ClustMix"): records are rows of L2 norm ≤ 1 with
non-negative entries before any public basis (so two records are ≤ √2 apart, and a
contraction keeps both bounds); every record is assigned to the nearest centre of its own group
(its class), the centres being public (data-independent, or earlier noisy outputs). The step
releases every cluster's sum with N(0, σ_s²) per coordinate and every cluster's count with
N(0, σ_c²). Replacing one record x by x′ moves either one sum by x′ − x (same cluster: ‖·‖ ≤ √2,
counts unchanged) or two sums by −x and +x′ and two counts by ∓1 (‖x‖, ‖x′‖ ≤ 1): the step is a
Gaussian mechanism of μ² = max(2/σ_s², 2/σ_s² + 2/σ_c²) = 2/σ_s² + 2/σ_c². Steps compose as
GDP (√Σμ²), adaptively.

Centres are initialised without private data: the first step has one centre per group at the
origin (so it releases each group's noisy sum and count), and each later step until there are
``clusters`` per group splits every surviving centre c into c ± ``SPLIT_OFFSET``·u, u a random
unit direction (bisecting k-means: public randomness around public centres). Clusters whose
noisy count falls below ``drop_below`` count-noise stds are merged, per group, into one
remainder cluster, itself dropped when its pooled noisy count is too small (``survivors``): a
function of the noisy outputs (post-processing), so the number of centres, and the work that
follows, tell nothing more.

Random Fourier features (``FourierFeatures``; DPGM's Algorithm 2, optional for ClustMix): the
steps then cluster φ(x) = [cos(Ωᵀx), sin(Ωᵀx)]/√d, Ω (k × d) drawn without reading data,
entries N(0, 1/w²), so that φ(x)·φ(x′) is a Monte-Carlo estimate of the rbf kernel
exp(−‖x − x′‖²/(2w²)) and Lloyd's algorithm in φ-space is kernel k-means. Every φ(x) has norm
exactly 1 (cos² + sin² = 1 per frequency, d frequencies over d): no clipping, but its entries
take both signs, so a record replaced within its cluster moves that sum by up to 2 (not √2):
a step is μ-GDP with μ² = max(4/σ_s², 2/σ_s² + 2/σ_c²) (``step_mu2``). The counts then ride
free at σ_c = σ_s (2/σ² + 2/σ² = 4/σ²), which is what the accountants declare for such steps.
Features are computed chunk by chunk, never for all n records at once (memory ≈ chunk × 2d).

Written by hand: no library runs Lloyd's algorithm on noisy sufficient statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpcore.mechanisms import float_error, segments
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom

# Distance of a split's two children from their parent, in the rows' units (norm ≤ 1): small
# against a cluster's spread, large against float noise. Public and fixed.
SPLIT_OFFSET = 0.05

# Per-row sensitivities the noise scales declare (see the module docstring: a moved record
# changes each of two sum rows by ≤ 1 and each of two counts by 1; a record replaced within
# its cluster changes one sum row by ≤ √2, bounded by the joint analysis above). Declaring 1
# (not √2) keeps the sampler's rounding cover relative to the smaller change: a row that moves
# by a ≤ 1 then moves by ≤ (a + s)/(1 + s) ≤ 1 in noise units, one that moves by √2 by ≤ √2.
SUM_ROW_SENSITIVITY = 1.0
COUNT_SENSITIVITY = 1.0
# Random Fourier features have norm 1 and both signs: a sum row moves by ≤ 2 (see above).
FOURIER_SUM_SENSITIVITY = 2.0
# The rounding cover of every sum row is relative to the smaller move, 1 (a record moved
# between clusters: two rows by ≤ 1 each), as for the rows above: a row that moves by a ≤ 1
# then moves by ≤ (a + b)/(1 + b) ≤ 1 in noise units, one that moves by 2 by ≤ 2, so
# μ² ≤ max(4/σ_s², 2/σ_s² + 2/σ_c²) holds for the rounded rows. Relative to 2 the moved case
# would give 2(1 + b)²/((1 + b/2)²σ_s²) > 2/σ_s².
SUM_ROW_UNIT = 1.0


def step_mu2(*, sigma_sums: float, sigma_counts: float, fourier: bool) -> float:
    """μ² of one noisy step (module docstring): a record moved between clusters, 2/σ_s² +
    2/σ_c²; one replaced within its cluster, ‖x′ − x‖²/σ_s² with ‖x′ − x‖ ≤ √2 (non-negative
    rows of norm ≤ 1: never the larger) or ≤ 2 (Fourier features)."""
    moved = 2.0 / sigma_sums**2 + 2.0 / sigma_counts**2
    within = (4.0 if fourier else 2.0) / sigma_sums**2
    return max(moved, within)


@dataclass(frozen=True)
class FourierFeatures:
    """φ(x) = [cos(xΩ), sin(xΩ)]/√d for rows x (k features), Ω (k × d) public: drawn by
    ``draw`` from the release's generator, reading no data. Norm of every φ(x): exactly 1."""

    frequencies: torch.Tensor  # (k, d) float64

    @classmethod
    def draw(
        cls,
        k: int,
        frequencies: int,
        width: float,
        generator: SecureRandom,
        device: torch.device | str = "cpu",
    ) -> FourierFeatures:
        """d = ``frequencies`` draws of N(0, I/w²) in k dimensions: the rbf kernel of
        bandwidth w = ``width``."""
        if frequencies < 1 or not width > 0:
            raise ValueError("need frequencies >= 1 and width > 0")
        omega = generator.normal((k, frequencies), device=device, dtype=torch.float64)
        return cls(omega / width)

    @property
    def dim(self) -> int:
        """2d: the features' dimension."""
        return 2 * int(self.frequencies.shape[1])

    def sum_error(self, input_error: float, *, terms: int) -> float:
        """Extra distance between neighbours' computed sums of ``terms`` feature rows, beyond
        the sensitivity 2, when each input row may be off by ``input_error`` (L2): the replaced
        record's features, off by ≤ L·(e + γ_k) + 2⁻⁵¹ per entry-pair, twice (L = max‖ω_j‖,
        cos and sin 1-Lipschitz, each correctly rounded to within an ulp of a value ≤ 1), plus
        the float64 summation of unit-norm rows."""
        k = int(self.frequencies.shape[0])
        lipschitz = float(self.frequencies.norm(dim=0).max())
        return _fourier_sum_error(lipschitz, k, input_error, terms)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        angles = rows.double() @ self.frequencies.to(rows.device)
        scale = 1.0 / math.sqrt(self.frequencies.shape[1])
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1) * scale


def _fourier_sum_error(lipschitz: float, k: int, input_error: float, terms: int) -> float:
    """``FourierFeatures.sum_error`` for frequencies of largest norm ``lipschitz``."""
    row = math.sqrt(2.0) * (lipschitz * (input_error + float_error.gamma(k + 1)) + 2.0**-51)
    return 2.0 * row + float_error.scaled_sum(
        FOURIER_SUM_SENSITIVITY, terms=terms, magnitude=float(terms)
    )


# How far past √k (the norm's mean scale) a frequency's norm may be at admission: Gaussian
# concentration, P(‖ω‖·w ≥ √k + t) ≤ exp(−t²/2), with t = √(2 ln d) + this, makes a draw
# past the bound, over all d frequencies, less likely than exp(−this²/2).
_NORM_TAIL = 10.0


def check_rbf_width(
    *, k: int, frequencies: int, width: float, terms: int, input_error: float
) -> None:
    """Refuse (``InvalidParams``) a bandwidth so narrow that the Fourier features' rounding
    cover (``FourierFeatures.sum_error`` of rows of ``k`` features off by at most
    ``input_error``) would pass the unit the k-means sums are analysed at, which the job's
    sampler refuses after it has read the data: checked at admission with a bound on the
    frequencies' largest norm (``_NORM_TAIL``), from public figures only."""
    from dpcore.mechanisms.spec import InvalidParams

    lipschitz = (math.sqrt(k) + math.sqrt(2.0 * math.log(frequencies)) + _NORM_TAIL) / width
    error = _fourier_sum_error(lipschitz, k, input_error, terms)
    if not error < SUM_ROW_UNIT:
        raise InvalidParams(
            f"rbf_width {width:g} is too narrow for {k} features: the Fourier features' "
            "floating-point error would exceed what the noise covers (a kernel this narrow "
            "also makes every pair of records orthogonal); use a larger rbf_width"
        )


def _space(rows: torch.Tensor, features: FourierFeatures | None) -> torch.Tensor:
    """Rows in the space the centres live in: themselves, or their Fourier features."""
    return rows if features is None else features(rows)


def split_steps(clusters: int) -> int:
    """Splitting steps from one centre per group to ``clusters``: ⌈log₂ clusters⌉."""
    if clusters < 1:
        raise ValueError(f"clusters must be >= 1, got {clusters}")
    return math.ceil(math.log2(clusters)) if clusters > 1 else 0


def kmeans_steps(clusters: int, refine: int) -> int:
    """Noisy steps of ``dp_kmeans``: the initial group sums, the splits, ``refine`` more —
    none for one cluster per group, whose only centre needs no data: every record of a group
    joins it whatever it is."""
    if clusters == 1:
        return 0
    return 1 + split_steps(clusters) + refine


@dataclass(frozen=True)
class StepNoise:
    """The noise of one step: σ of every coordinate of a cluster's sum, σ of its count."""

    sums: float
    counts: float


@dataclass
class Centres:
    """Public centres: ``points`` (m, k) float64 and the group (class) of each, (m,)."""

    points: torch.Tensor
    groups: torch.Tensor

    def __len__(self) -> int:
        return int(self.points.shape[0])


def assign(
    Z: torch.Tensor,
    groups: torch.Tensor,
    centres: Centres,
    *,
    chunk: int,
    features: FourierFeatures | None = None,
) -> torch.Tensor:
    """Each record's nearest centre of its own group (index into ``centres``; −1 when its group
    has none left), in the centres' space (``features``: Fourier features of the rows).
    Chunked: memory ≈ chunk × (m distances + the features)."""
    out = torch.empty(Z.shape[0], dtype=torch.int64, device=Z.device)
    if len(centres) == 0:
        return out.fill_(-1)
    sq = (centres.points**2).sum(dim=1)
    for start in range(0, Z.shape[0], chunk):
        z = _space(Z[start : start + chunk], features)
        g = groups[start : start + chunk]
        dist = sq[None, :] - 2.0 * (z @ centres.points.T)
        dist = dist.masked_fill(g[:, None] != centres.groups[None, :], math.inf)
        best = dist.argmin(dim=1)
        alone = torch.isinf(dist.gather(1, best[:, None]))[:, 0]
        out[start : start + chunk] = best.masked_fill(alone, -1)
    return out


def noisy_statistics(
    Z: torch.Tensor,
    assignment: torch.Tensor,
    clusters: int,
    *,
    sigma_sums: float,
    sigma_counts: float,
    sampler: NoiseSampler,
    error: float,
    features: FourierFeatures | None = None,
    chunk: int = 65536,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cluster's sum (clusters, k) of the rows (or of their Fourier ``features``: then
    (clusters, 2d)) and count (clusters,), each noised (float64). Records assigned −1 enter no
    cluster (their group has no centre; the bound above still holds). Chunked."""
    k = Z.shape[1] if features is None else features.dim
    # One extra row for the records of no cluster, dropped: the work is the same for every
    # record, however many have a cluster (segments.outside).
    sums = torch.zeros((clusters + 1, k), dtype=torch.float64, device=Z.device)
    counts = torch.zeros((clusters + 1, 1), dtype=torch.float64, device=Z.device)
    for start in range(0, Z.shape[0], chunk):
        index = segments.outside(assignment[start : start + chunk], clusters)
        rows = _space(Z[start : start + chunk], features)
        segments.segment_sum(sums, index, rows.double())
        ones = torch.ones((index.shape[0], 1), dtype=torch.float64, device=Z.device)
        segments.segment_sum(counts, index, ones)
    sums, counts = sums[:clusters], counts[:clusters]
    sensitivity = SUM_ROW_SENSITIVITY if features is None else FOURIER_SUM_SENSITIVITY
    noisy_sums = sampler(
        sums, sigma=sigma_sums, sensitivity=sensitivity, error=error, unit=SUM_ROW_UNIT
    )
    # Counts are exact integers in float64 (n < 2⁵³): no rounding to cover.
    noisy_counts = sampler(counts, sigma=sigma_counts, sensitivity=COUNT_SENSITIVITY)
    return noisy_sums.double(), noisy_counts.double()[:, 0]


def _split(centres: Centres, generator: SecureRandom, clusters: int) -> Centres:
    """Split centres of each group until it has ``clusters`` (its first ones, in order: a
    public choice), each into two at ± ``SPLIT_OFFSET`` along a random direction."""
    points, groups = centres.points, centres.groups
    chosen = torch.zeros(len(centres), dtype=torch.bool, device=points.device)
    for g in torch.unique(groups).tolist():
        members = torch.nonzero(groups == g)[:, 0]
        chosen[members[: max(0, min(len(members), clusters - len(members)))]] = True
    parents = points[chosen]
    directions = generator.normal(tuple(parents.shape), device=points.device)
    offset = SPLIT_OFFSET * directions / directions.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return Centres(
        torch.cat([points[~chosen], parents + offset, parents - offset]),
        torch.cat([groups[~chosen], groups[chosen], groups[chosen]]),
    )


def drop_threshold(drop_below: float, sigma_counts: float) -> float:
    """The noisy count a cluster needs to be kept: ``drop_below`` count-noise stds, and at
    least one record (a mean over a noisy count near zero is noise over noise)."""
    return max(drop_below * sigma_counts, 1.0)


def step(
    Z: torch.Tensor,
    groups: torch.Tensor,
    centres: Centres,
    noise: StepNoise,
    sampler: NoiseSampler,
    *,
    error: float,
    chunk: int,
    features: FourierFeatures | None = None,
    sum_features: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One noisy Lloyd step: assign every record to its nearest centre (in the centres' space:
    the rows, or their Fourier ``features``), then the clusters' noisy sums — of the same
    features, or of the rows themselves (``sum_features`` False: the final step of a release
    that clusters in feature space and releases means of records) — and counts (the Gaussian
    mechanism of the module docstring)."""
    assignment = assign(Z, groups, centres, chunk=chunk, features=features)
    return noisy_statistics(
        Z,
        assignment,
        len(centres),
        sigma_sums=noise.sums,
        sigma_counts=noise.counts,
        sampler=sampler,
        error=error,
        features=features if sum_features else None,
        chunk=chunk,
    )


def pools(
    counts: torch.Tensor, groups: torch.Tensor, *, drop_below: float, sigma_counts: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Which clusters a step keeps (post-processing of its noisy counts): the mask of those
    whose noisy count reaches ``drop_threshold``, and, per group, the mask of the m that do not
    when their summed count (noise σ_c·√m) reaches the threshold at σ_c·√m — merged into one.
    So small clusters pool into their class's remainder instead of vanishing, and a class is
    lost only when all of it is too small to see."""
    keep = counts >= drop_threshold(drop_below, sigma_counts)
    merged = []
    for g in torch.unique(groups[~keep]).tolist():
        small = (~keep) & (groups == g)
        m = int(small.sum())
        if float(counts[small].sum()) >= drop_threshold(drop_below, sigma_counts * math.sqrt(m)):
            merged.append(small)
    return keep, merged


def survivors(
    centres: Centres,
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    drop_below: float,
    sigma_counts: float,
) -> tuple[Centres, torch.Tensor]:
    """The clusters kept after a step (``pools``), at their noisy means, with their noisy
    counts; a merged cluster's noisy sums and counts are added."""
    keep, merged = pools(counts, centres.groups, drop_below=drop_below, sigma_counts=sigma_counts)
    points, groups, kept_counts = (
        [sums[keep] / counts[keep, None]],
        [centres.groups[keep]],
        [counts[keep]],
    )
    for small in merged:
        count = counts[small].sum()
        points.append((sums[small].sum(dim=0) / count)[None, :])
        groups.append(centres.groups[small][:1])
        kept_counts.append(count[None])
    return Centres(torch.cat(points), torch.cat(groups)), torch.cat(kept_counts)


Progress = Callable[[int, int], None]


def dp_kmeans(
    Z: torch.Tensor,
    groups: torch.Tensor,
    n_groups: int,
    *,
    clusters: int,
    refine: int,
    noise: StepNoise,
    sampler: NoiseSampler,
    generator: SecureRandom,
    error: float,
    drop_below: float,
    chunk: int,
    progress: Progress | None = None,
    features: FourierFeatures | None = None,
) -> Centres:
    """Public centres, up to ``clusters`` per group, from ``kmeans_steps(clusters, refine)``
    noisy Lloyd steps (see the module docstring). ``Z`` (n, k) float64 rows of norm ≤ 1,
    ``groups`` (n,) their group indices; with ``features``, the centres are in the space of
    the rows' Fourier features (kernel k-means), and ``error`` is then the bound of
    ``FourierFeatures.sum_error``."""
    device = Z.device
    dim = Z.shape[1] if features is None else features.dim
    centres = Centres(
        torch.zeros((n_groups, dim), dtype=torch.float64, device=device),
        torch.arange(n_groups, device=device),
    )
    splits, total = split_steps(clusters), kmeans_steps(clusters, refine)
    for index in range(total):
        if 1 <= index <= splits:
            centres = _split(centres, generator, clusters)
        sums, counts = step(
            Z,
            groups,
            centres,
            noise,
            sampler,
            error=error,
            chunk=chunk,
            features=features,
        )
        centres, _ = survivors(
            centres, sums, counts, drop_below=drop_below, sigma_counts=noise.counts
        )
        if progress is not None:
            progress(index + 1, total)
    return centres
