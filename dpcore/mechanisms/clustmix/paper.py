"""ClustMix variant ``paper``: Algorithm 2 of "Approximate, Adapt, Anonymize (3A)" (Madl et al.).

Per class, the records are cut into regions by random slicing; in each region an isotropic GMM
is fitted by EM and every record gets a cluster under the size constraint (every cluster ≥ l
records); the cluster centroids of all classes are adapted together by KIP (Eq. 6); the
memberships are recomputed around the adapted centroids (again every cluster ≥ l); each
released row is the mean of its cluster plus Gaussian noise of std σ_t = σ·l/N_t (Eq. 8 at the
cluster's size N_t, Algorithm 2 line 16).

Research release only: the clustering, the cluster sizes and the adaptation read the data and
are not charged (the ``paper`` accountant counts the final averaging alone, as the paper does).
The paper works on raw features: no basis. Rows are the unit-scale preprocessing's (features in
[0, 1], rows of norm ≤ 1), as the dp variant's.

Written by hand (torch and scipy's assignment solver): no library fits a GMM under a minimum
cluster size or runs KIP in torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from dpcore.mechanisms import float_error, segments
from dpcore.mechanisms.clustmix.accounting import paper_sensitivity
from dpcore.mechanisms.clustmix.distances import square_distances
from dpcore.mechanisms.clustmix.params import ClustMixParams
from dpcore.mechanisms.clustmix.rows import cluster_rows, row_repeats
from dpcore.mechanisms.contract import PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import RowTransform, scale_to_unit

# Algorithm 2's domain: x ∈ [0, 1]^D (no row scaling: Eq. 8's σ is for that scale).
PAPER_SCALE: dict[str, str] = {
    "features": "clip to the declared feature_range, scale to [0, 1] (Algorithm 2's domain; "
    "rows are not rescaled)",
    "statistics": "none computed from the data",
}

# The largest region the exact constrained assignment takes (an m × m float64 matrix: 800 MB;
# regions hold < 1.5·slice_rows records, or < 2·l_min when l_min passes slice_rows).
MAX_REGION = 10_000
# Lloyd iterations of the size-constrained k-means (gmm_iters = 0), each one exact constrained
# assignment and a mean update.
KMEANS_ITERS = 5
# Least per-coordinate variance of a GMM component (features in [0, 1]): keeps log v finite when a
# component collapses onto repeated records.
VARIANCE_FLOOR = 1e-6
# A component whose responsibilities sum below this keeps its previous mean and variance.
DEAD_COMPONENT = 1e-8
# σ_b² of the NTK (every layer's bias variance): keeps every Σ positive (an all-zero record
# has Σ⁰ = σ_b² > 0, so the angles are defined).
NTK_BIAS = 0.01
# cos θ of the NTK's arc-cosine recursion is clamped to [−1 + c, 1 − c]: arccos has an infinite
# slope at ±1, and on the diagonal cos θ = 1 exactly.
NTK_CLAMP = 1e-6

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Report = Callable[[float, float, str], None]


# ------------------------------------------------------------------------------------------
# size-constrained assignment
# ------------------------------------------------------------------------------------------


def constrained_assignment(cost: torch.Tensor, least: int) -> torch.Tensor:
    """The assignment z (m,) of m records to the n = ``cost.shape[1]`` clusters minimising
    Σ_i cost[i, z_i] subject to every cluster holding ≥ ``least`` records (needs n·least ≤ m).

    Exact, by one linear assignment on an m × m matrix: n·least "mandatory" columns (``least``
    copies of each cluster's cost column) and m − n·least "free" columns, each costing
    min_k cost[i, k] for record i; a record matched to a free column joins its cheapest cluster.
    Any feasible z gives a perfect matching of cost ≤ Σ cost[i, z_i] (put ``least`` of each
    cluster's records on its mandatory columns, the rest on free columns, where they cost their
    minimum, at most cost[i, z_i]); any perfect matching gives a feasible z (each cluster has
    its ``least`` mandatory records) of exactly the matching's cost. So the optimal matching
    is an optimal constrained assignment. Memory: m² float64 (m is a region's size)."""
    m, n = cost.shape
    if n * least > m:
        raise ValueError(f"{n} clusters of ≥ {least} records need {n * least} > {m} records")
    values = cost.detach().to(device="cpu", dtype=torch.float64).numpy()
    matrix = np.empty((m, m), dtype=np.float64)
    mandatory = n * least
    for copy in range(least):
        # Column k·least + copy is the copy-th seat of cluster k.
        matrix[:, copy:mandatory:least] = values
    cheapest = values.argmin(axis=1)
    matrix[:, mandatory:] = values[np.arange(m), cheapest][:, None]
    rows, cols = linear_sum_assignment(matrix)
    z = np.where(cols < mandatory, cols // least, cheapest[rows])
    out = np.empty(m, dtype=np.int64)
    out[rows] = z
    return torch.as_tensor(out, device=cost.device)


# ------------------------------------------------------------------------------------------
# approximate: random slicing, GMM by EM, the constrained hard assignment
# ------------------------------------------------------------------------------------------


def random_slices(
    X: torch.Tensor, least: int, slice_rows: int, generator: SecureRandom
) -> list[torch.Tensor]:
    """Indices of the regions of one class: s = round(m / slice_rows) regions (at least one,
    at most m // least) of near-equal size, cut at equal ranks of the records' projections on
    a random unit direction. The paper samples cutoff points from the data; equal ranks give
    every region ≥ ``least`` records (⌊m/s⌋ ≥ least exactly when s ≤ m // least), which the
    size constraint needs."""
    m, d = X.shape
    s = max(1, min(round(m / slice_rows), m // least))
    if math.ceil(m / s) > MAX_REGION:
        raise ValueError(
            f"clusters of ≥ {least} records need regions of {math.ceil(m / s)} records, over "
            f"the {MAX_REGION} the exact size-constrained assignment can hold (m² memory): "
            "ask for a smaller cluster_size (or a larger sigma_max)"
        )
    if s == 1:
        return [torch.arange(m, device=X.device)]
    direction = generator.normal((d,), device=X.device, dtype=X.dtype)
    direction = direction / direction.norm().clamp_min(1e-12)
    order = torch.argsort(X @ direction, stable=True)
    return list(torch.tensor_split(order, s))


def _random_rows(m: int, n: int, generator: SecureRandom, device: torch.device) -> torch.Tensor:
    """n distinct indices of {0, …, m − 1}, uniformly (the order of uniform sort keys)."""
    keys = generator.keys((m,), device=device)
    return torch.argsort(keys, stable=True)[:n]


@dataclass
class Gmm:
    """An isotropic GMM: means (n, d), per-component variance v_k (n,) per coordinate, log
    mixing weights (n,)."""

    means: torch.Tensor
    variances: torch.Tensor
    log_weights: torch.Tensor

    def log_joint(self, X: torch.Tensor) -> torch.Tensor:
        """log π_k + log N(x_i; μ_k, v_k I) (m, n)."""
        d = X.shape[1]
        log_var = torch.log(self.variances)
        return (
            self.log_weights[None, :]
            - 0.5 * d * (math.log(2.0 * math.pi) + log_var)[None, :]
            - square_distances(X, self.means) / (2.0 * self.variances)[None, :]
        )


def fit_gmm(X: torch.Tensor, n: int, iters: int, generator: SecureRandom) -> Gmm:
    """EM for an isotropic GMM of n components on X (m, d) float64: means start at n random
    records, variances at the region's per-coordinate variance, weights uniform;
    responsibilities in log space."""
    m, d = X.shape
    means = X[_random_rows(m, n, generator, X.device)].clone()
    spread = ((X - X.mean(dim=0)) ** 2).sum(dim=1).mean() / d
    variances = spread.clamp_min(VARIANCE_FLOOR).expand(n).clone()
    gmm = Gmm(means, variances, torch.full((n,), -math.log(n), dtype=X.dtype, device=X.device))
    for _ in range(iters):
        log_joint = gmm.log_joint(X)
        r = torch.exp(log_joint - torch.logsumexp(log_joint, dim=1, keepdim=True))
        mass = r.sum(dim=0)
        alive = mass > DEAD_COMPONENT
        safe = mass.clamp_min(DEAD_COMPONENT)
        means = torch.where(alive[:, None], (r.T @ X) / safe[:, None], gmm.means)
        within = (r * square_distances(X, means)).sum(dim=0) / (d * safe)
        variances = torch.where(alive, within, gmm.variances).clamp_min(VARIANCE_FLOOR)
        gmm = Gmm(means, variances, torch.log(safe / m))
    return gmm


def cluster_means(X: torch.Tensor, z: torch.Tensor, n: int) -> torch.Tensor:
    """The mean of each of the n clusters of z (every one non-empty here)."""
    sums = segments.segment_sum(torch.zeros((n, X.shape[1]), dtype=X.dtype, device=X.device), z, X)
    counts = torch.bincount(z, minlength=n).to(X.dtype)
    return sums / counts[:, None]


def approximate(X: torch.Tensor, least: int, iters: int, generator: SecureRandom) -> torch.Tensor:
    """One region's clusters (m // least of them, each ≥ ``least`` records): the assignment z.

    The paper maximises the joint likelihood of Eq. 3–4 by EM with a step-function prior on
    cluster sizes (zero below l_min), falling back to constrained k-means. Here EM runs
    unconstrained, then the hard assignment maximises Σ_i log π_{z_i} p(x_i | θ_{z_i})
    subject to every size ≥ l exactly (``constrained_assignment``): the MAP assignment under
    that step-function size prior for the fitted components. ``iters`` = 0: size-constrained
    k-means from random records (``KMEANS_ITERS`` exact constrained assignments on squared
    distances, each followed by the mean update)."""
    n = X.shape[0] // least
    if iters > 0:
        gmm = fit_gmm(X, n, iters, generator)
        return constrained_assignment(-gmm.log_joint(X), least)
    centres = X[_random_rows(X.shape[0], n, generator, X.device)]
    z = torch.zeros(X.shape[0], dtype=torch.int64, device=X.device)
    for _ in range(KMEANS_ITERS):
        z = constrained_assignment(square_distances(X, centres), least)
        centres = cluster_means(X, z, n)
    return z


# ------------------------------------------------------------------------------------------
# adapt: KIP (Eq. 5/6)
# ------------------------------------------------------------------------------------------


def rbf_kernel(A: torch.Tensor, B: torch.Tensor, width: float) -> torch.Tensor:
    """exp(−‖a − b‖²/(2·D·w²)): bandwidth w per feature (w√D in all), so that one width
    suits any D for features in [0, 1]."""
    return torch.exp(-square_distances(A, B) / (2.0 * A.shape[1] * width * width))


def ntk_kernel(
    A: torch.Tensor, B: torch.Tensor, depth: int, bias: float = NTK_BIAS
) -> torch.Tensor:
    """The NTK of a fully-connected ReLU network with ``depth`` hidden layers (weight variance
    σ_w² = 2, bias variance σ_b² = ``bias``), by the arc-cosine recursion (Jacot et al. 2018):
    Σʰ = (σ_w²/2π)·‖·‖‖·‖′·(sin θ + (π − θ) cos θ) + σ_b², Σ̇ʰ = (σ_w²/2π)(π − θ),
    Θʰ = Θʰ⁻¹·Σ̇ʰ + Σʰ, from Θ⁰ = Σ⁰.

    Σ⁰ = a·b + σ_b², not a·b/d: the 1/d of the usual first layer is for z-scored inputs of
    norm ≈ √d, while rows in [0, 1]^D have norm ≤ √D (with 1/d the bias would swamp the
    angles of sparse rows, and the kernel is homogeneous in the norms anyway).

    K(A, A) (``B is A``) gets its diagonal in closed form: the clamp moves the angle of a
    record with itself from 0 to about √(2·``NTK_CLAMP``), which would cost Σ̇ a relative
    4.5e-4 there."""
    sigma = A @ B.T + bias
    diag_a = (A * A).sum(dim=1) + bias
    diag_b = (B * B).sum(dim=1) + bias
    theta = sigma
    # On the diagonal θ = 0: Σ̇ʰ = 1 and Σʰ(x, x) = Σʰ⁻¹(x, x) + σ_b².
    exact = diag_a
    for _ in range(depth):
        norms = torch.sqrt(diag_a[:, None] * diag_b[None, :])
        cos = (sigma / norms).clamp(-1.0 + NTK_CLAMP, 1.0 - NTK_CLAMP)
        angle = torch.arccos(cos)
        # σ_w²/2π = 1/π with σ_w² = 2.
        sigma = norms * (torch.sin(angle) + (math.pi - angle) * cos) / math.pi + bias
        derivative = (math.pi - angle) / math.pi
        theta = theta * derivative + sigma
        diag_a = diag_a + bias
        diag_b = diag_b + bias
        exact = exact + diag_a
    if B is A:
        theta = torch.diagonal_scatter(theta, exact)
    return theta


def kernel_of(params: ClustMixParams) -> Kernel:
    if params.kernel == "rbf":
        return partial(rbf_kernel, width=params.kernel_width)
    return partial(ntk_kernel, depth=params.ntk_depth)


def kip_loss(
    X: torch.Tensor,
    anchor: torch.Tensor,
    y_support: torch.Tensor,
    X_target: torch.Tensor,
    y_target: torch.Tensor,
    *,
    alpha: float,
    ridge: float,
    kernel: Kernel,
) -> torch.Tensor:
    """Eq. 6: α·‖X − X̃‖²_F/‖X̃‖²_F + (1 − α)·½·(1/b)·Σ_t ‖y_t − K(x_t, X)(K(X, X) + λI)⁻¹ y_s‖².

    The kernel-ridge term of Eq. 5 is a sum over the target batch; we take its mean over the
    b targets (our choice) so that α weighs the same two terms whatever kip_batch is."""
    distance = ((X - anchor) ** 2).sum() / (anchor**2).sum().clamp_min(1e-12)
    support = kernel(X, X)
    support = 0.5 * (support + support.T)  # exactly symmetric for the solver
    eye = torch.eye(X.shape[0], dtype=X.dtype, device=X.device)
    weights = torch.linalg.solve(support + ridge * eye, y_support)
    residual = y_target - kernel(X_target, X) @ weights
    fit = 0.5 * (residual**2).sum(dim=1).mean()
    return alpha * distance + (1.0 - alpha) * fit


def adapt(
    anchor: torch.Tensor,
    y_support: torch.Tensor,
    records: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    params: ClustMixParams,
    generator: SecureRandom,
    report: Report,
) -> torch.Tensor:
    """KIP (Algorithm 2 line 11): Adam on the support set X from X̃ = ``anchor`` for kip_steps
    steps on Eq. 6, each against kip_batch real records drawn uniformly (with replacement)
    from all of ``records`` (float32 in [0, 1]^D; the targets)."""
    X = anchor.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([X], lr=params.kip_lr)
    kernel = kernel_of(params)
    steps = params.kip_steps
    for index in range(steps):
        batch = generator.randint(records.shape[0], (params.kip_batch,), device=records.device)
        X_target = records[batch].to(anchor.dtype)
        y_target = torch.nn.functional.one_hot(labels[batch], n_classes).to(anchor.dtype)
        optimiser.zero_grad()
        loss = kip_loss(
            X,
            anchor,
            y_support,
            X_target,
            y_target,
            alpha=params.alpha,
            ridge=params.ridge,
            kernel=kernel,
        )
        loss.backward()
        optimiser.step()
        report(index + 1, steps, "kip")
    return X.detach()


# ------------------------------------------------------------------------------------------
# the whole clustering
# ------------------------------------------------------------------------------------------


@dataclass
class Clustering:
    """The clusters of a paper release. ``members`` (n,): each record's cluster (−1: its class
    has fewer than l records); ``classes`` (k,): each cluster's class; ``centroids`` X̃ (k, d):
    the means of the GMM step's clusters; ``adapted`` (k, d): after KIP (X̃ itself without it);
    ``skipped``: the classes with fewer than l records."""

    members: torch.Tensor
    classes: torch.Tensor
    centroids: torch.Tensor
    adapted: torch.Tensor
    regions: int
    skipped: list[int] = field(default_factory=list)

    def sizes(self) -> torch.Tensor:
        """N_t of every cluster (k,)."""
        used = self.members[self.members >= 0]
        return torch.bincount(used, minlength=int(self.classes.shape[0]))


def cluster_size(params: ClustMixParams, ctx: RunContext) -> int:
    """l = l_min: the request's cluster_size, else the one the paper accountant fixed from
    sigma_max (it travels in the noise description's analysis as well)."""
    if params.cluster_size is not None:
        return params.cluster_size
    fixed = ctx.noise.analysis.get("cluster_size")
    if fixed is None:
        raise ValueError(
            "clustmix variant paper needs cluster_size (l_min): give it, or sigma_max with a "
            "target ε so that the paper accountant's calibration fixes it"
        )
    return int(fixed)


def clustering(
    params: ClustMixParams,
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    least: int,
    ctx: RunContext,
) -> Clustering:
    """Algorithm 2 lines 3–14 on ``features`` in [0, 1]^D (n, d) with class indices ``labels``:
    regions per class, constrained GMM clusters, KIP on all centroids, memberships recomputed
    around the adapted centroids (every cluster ≥ ``least`` records throughout)."""
    device = features.device
    regions: list[tuple[int, torch.Tensor]] = []
    skipped: list[int] = []
    for c in range(n_classes):
        index = torch.nonzero(labels == c)[:, 0]
        if index.shape[0] < least:
            skipped.append(c)
            continue
        X = features[index].double()
        for part in random_slices(X, least, params.slice_rows, ctx.generator):
            regions.append((c, index[part]))

    # Approximate: per region, the constrained clusters and their means X̃.
    centroids: list[torch.Tensor] = []
    classes: list[int] = []
    first: list[int] = []  # each region's first cluster
    for done, (c, index) in enumerate(regions):
        X = features[index].double()
        z = approximate(X, least, params.gmm_iters, ctx.generator)
        n = X.shape[0] // least
        first.append(len(classes))
        centroids.append(cluster_means(X, z, n))
        classes.extend([c] * n)
        ctx.report(done + 1, len(regions), "gmm")
    d = features.shape[1]
    anchor = (
        torch.cat(centroids)
        if centroids
        else torch.zeros((0, d), dtype=torch.float64, device=device)
    )
    cluster_class = torch.as_tensor(classes, dtype=torch.int64, device=device)

    # Adapt. The paper's prose says α = 0 keeps the GMM output, but Eq. 6 and Algorithm 2
    # weight the distance term by α; we follow the formula: α = 1 is no adaptation.
    adapted = anchor
    if params.kip_steps > 0 and params.alpha < 1 and anchor.shape[0] > 0:
        y_support = torch.nn.functional.one_hot(cluster_class, n_classes).to(anchor.dtype)
        adapted = adapt(
            anchor, y_support, features, labels, n_classes, params, ctx.generator, ctx.report
        )

    # Memberships around the adapted centroids (Algorithm 2 lines 12–14), within each region.
    members = torch.full((features.shape[0],), -1, dtype=torch.int64, device=device)
    for done, ((_, index), start) in enumerate(zip(regions, first, strict=True)):
        X = features[index].double()
        n = X.shape[0] // least
        cost = square_distances(X, adapted[start : start + n])
        members[index] = start + constrained_assignment(cost, least)
        ctx.report(done + 1, len(regions), "means")
    return Clustering(members, cluster_class, anchor, adapted, len(regions), skipped)


# ------------------------------------------------------------------------------------------
# anonymize: Eq. 8 noise per cluster
# ------------------------------------------------------------------------------------------


def noisy_means(
    features: torch.Tensor, found: Clustering, least: int, ctx: RunContext
) -> torch.Tensor:
    """Each cluster's mean plus N(0, σ_t²) per feature, σ_t = σ·l/N_t (float64, not clipped).

    σ_t is ``ClustMixPaperEvent.cluster_sigma(N_t)``. The sampler adds only the declared
    scale σ ("means", at sensitivity ``paper_sensitivity(l, D)``), so it noises each cluster's
    sum/l — the mean scaled by N_t/l, which moves by no more than a mean of l records — at σ,
    and the result is scaled back by l/N_t: the mean plus noise of std σ·l/N_t exactly."""
    k, d = found.centroids.shape[0], features.shape[1]
    sizes = found.sizes()
    if k == 0:
        return torch.zeros((0, d), dtype=torch.float64, device=features.device)
    sums = torch.zeros((k + 1, d), dtype=torch.float64, device=features.device)
    sums = segments.segment_sum(sums, segments.outside(found.members, k), features.double())[:k]
    sensitivity = paper_sensitivity(least, d)
    largest = int(sizes.max())
    # Sums of up to N_max records of norm ≤ √D in float64, scaled by 1/l.
    error = float_error.scaled_sum(
        sensitivity, terms=largest, magnitude=largest * math.sqrt(d) / least
    )
    scaled = sums / least
    # The √2 case of the sensitivity is two rows moving by √D/(l + 1) each, the other one row
    # by √D/l: the rounding cover (per row) is relative to the smaller row move, so that both
    # cases, rounded, stay within the sensitivity in noise units.
    unit = min(sensitivity, math.sqrt(d) / (least + 1))
    noisy = ctx.sampler(
        scaled, sigma=ctx.sigma("means"), sensitivity=sensitivity, error=error, unit=unit
    )
    return noisy.double() * (least / sizes.to(torch.float64))[:, None]


def paper_features(data: PrivateData, device: torch.device) -> torch.Tensor:
    """Records in [0, 1]^D by the declared bounds (float32), as Algorithm 2 takes them."""
    return torch.as_tensor(
        scale_to_unit(data.X, data.lo, data.hi), dtype=torch.float32, device=device
    )


def release(params: ClustMixParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    """A variant paper release: one row per cluster (or n_samples rows, clusters repeated in
    proportion to their sizes), each its noisy mean with its class."""
    least = cluster_size(params, ctx)
    features = paper_features(data, ctx.device)
    labels = torch.as_tensor(data.labels, dtype=torch.int64, device=ctx.device)
    n_classes = len(data.classes)
    found = clustering(params, features, labels, n_classes, least, ctx)
    means = noisy_means(features, found, least, ctx)
    sizes = found.sizes().cpu().numpy()
    classes = found.classes.cpu().numpy()
    repeats = row_repeats(params.n_samples, sizes.astype(np.float64))
    k = len(classes)
    method = (
        f"isotropic GMM, {params.gmm_iters} EM iterations"
        if params.gmm_iters
        else f"size-constrained k-means, {KMEANS_ITERS} iterations"
    )
    skipped = (
        f"; classes {found.skipped} have fewer than {least} records: no clusters, their "
        "records unused (KIP targets only)"
        if found.skipped
        else ""
    )
    adaptation = (
        f"KIP ({params.kernel} kernel"
        + (f", width {params.kernel_width:g}" if params.kernel == "rbf" else "")
        + (f", {params.ntk_depth} hidden layers" if params.kernel == "ntk" else "")
        + f"), α = {params.alpha:g}, λ = {params.ridge:g}, {params.kip_steps} Adam steps "
        f"(lr {params.kip_lr:g}, {params.kip_batch} real records a step); memberships "
        "recomputed around the adapted centroids"
        if params.kip_steps > 0 and params.alpha < 1
        else "none (α = 1 or no KIP steps): the GMM centroids"
    )
    return ReleaseOutput(
        rows=int(repeats.sum()),
        feature_names=list(data.feature_names),
        chunks=cluster_rows(means.float(), classes, repeats, n_classes),
        preprocessing={
            **PAPER_SCALE,
            "labels": "each cluster's class, exact (clusters are formed within classes)",
            "clusters": f"{k} clusters of ≥ {least} records in {found.regions} random slices "
            f"({method}, then the exact size-constrained assignment; sizes and memberships "
            "NOT charged: "
            f"research release){skipped}",
            "adaptation": adaptation,
            "noise": "each cluster's mean plus N(0, σ_t²) per feature, σ_t = σ·l/N_t (Eq. 8 "
            "at the cluster's size); not clipped to the domain",
            "rows": "one per cluster"
            if params.n_samples is None
            else "cluster means repeated in proportion to their (exact) sizes",
        },
        progress="own",
        # Algorithm 2 reads [0, 1]^D records, unclipped (clip_norm applies to variant dp).
        transform=RowTransform.unit_range(data.lo, data.hi, None),
    )
