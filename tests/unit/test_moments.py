"""Per-cluster moments: the sensitivity constants against attaining and random neighbours, the
step's μ², calibration, and the release's output domain."""

from __future__ import annotations

import math

import pytest
import torch

from dpcore.accounting import gdp
from dpcore.mechanisms import moments
from dpcore.mechanisms.basis import Basis, dct_basis
from dpcore.mechanisms.noise import FastNoise, SecureNoise
from dpcore.mechanisms.secure_random import SecureRandom


def exact(values: torch.Tensor, **_: object) -> torch.Tensor:
    """A sampler that adds nothing: the statistics themselves."""
    return values.double()


def stats(
    X: torch.Tensor,
    assignment: torch.Tensor,
    clusters: int,
    basis: Basis,
    clip: float,
    second_dim: int | None = None,
    pooled: bool = False,
) -> moments.NoisyMoments:
    """Noise-free statistics; with ``second_dim`` h < k, the h × h block plus the tail
    diagonal."""
    Z = basis.project(moments.unit_rows(X, clip))
    scales = moments.Scales(counts=1.0, sums=1.0, second=1.0)
    return moments.noisy_moments(
        Z,
        assignment,
        torch.arange(clusters),
        second_dim=second_dim or Z.shape[1],
        tail=second_dim is not None,
        pooled=pooled,
        scales=scales,
        sampler=exact,  # type: ignore[arg-type]
    )


def moved(a: moments.NoisyMoments, b: moments.NoisyMoments, s: moments.Scales) -> float:
    """‖Δ‖² of the released blocks in noise units."""
    return float(
        ((a.counts - b.counts) ** 2).sum() / s.counts**2
        + ((a.sums - b.sums) ** 2).sum() / s.sums**2
        + ((a.second - b.second) ** 2).sum() / s.second**2
    )


def test_constants() -> None:
    assert pytest.approx(math.sqrt(2)) == moments.SUM_SAME
    assert pytest.approx(math.sqrt(2)) == moments.SECOND_SAME
    assert moments.SUM_MOVED == moments.SECOND_MOVED == moments.COUNT_MOVED == 1.0


def test_triangle_is_frobenius() -> None:
    A = torch.randn(5, 6, 6, dtype=torch.float64)
    A = A + A.transpose(1, 2)
    v = moments.triangle(A)
    assert torch.allclose(v.norm(dim=1), A.flatten(1).norm(dim=1))
    assert torch.allclose(moments.untriangle(v, 6), A)


@pytest.mark.parametrize("clip", [1.0, 3.0])
def test_attaining_pairs(clip: float) -> None:
    """Identity basis, x and x′ disjoint indicator rows of norm C (non-negative, orthogonal):
    in the same cluster they reach SUM_SAME and SECOND_SAME; moved to another cluster, every
    block moves by its MOVED constant on each of two clusters."""
    width = round(clip**2)
    d, basis = 2 * width + 1, Basis(None, "identity")
    X = torch.zeros((3, d), dtype=torch.float64)
    X[1:, -1] = 0.5  # other records, untouched
    X2 = X.clone()
    X[0, :width] = 1.0
    X2[0, width : 2 * width] = 1.0
    same = torch.tensor([0, 0, 1])
    a = stats(X, same, 2, basis, clip)
    b = stats(X2, same, 2, basis, clip)
    assert float((a.sums - b.sums).norm()) == pytest.approx(moments.SUM_SAME)
    assert float((a.second - b.second).norm()) == pytest.approx(moments.SECOND_SAME)
    assert float((a.counts - b.counts).abs().sum()) == 0.0
    c = stats(X2, torch.tensor([1, 0, 1]), 2, basis, clip)
    assert (a.sums - c.sums).norm(dim=1).tolist() == pytest.approx([moments.SUM_MOVED] * 2)
    assert (a.second - c.second).norm(dim=1).tolist() == pytest.approx([moments.SECOND_MOVED] * 2)
    assert (a.counts - c.counts).abs().tolist() == [moments.COUNT_MOVED] * 2


def test_attaining_pair_reaches_step_mu2() -> None:
    """Unit rows e₁ (cluster 0) → e₂ (cluster 1): ‖Δ‖² in noise units is exactly step_mu2."""
    basis = Basis(None, "identity")
    X = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.5]], dtype=torch.float64)
    X2 = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]], dtype=torch.float64)
    a = stats(X, torch.tensor([0, 1]), 2, basis, 1.0)
    b = stats(X2, torch.tensor([1, 1]), 2, basis, 1.0)
    s = moments.Scales(counts=3.0, sums=2.0, second=5.0)
    mu2 = moments.step_mu2(sigma_counts=s.counts, sigma_sums=s.sums, sigma_second=s.second)
    assert moved(a, b, s) == pytest.approx(mu2)


def test_random_neighbours_within_bound() -> None:
    """Random non-negative records, DCT basis, random (re)assignment: never above the bound."""
    g = torch.Generator().manual_seed(0)
    basis = Basis(dct_basis((6, 6), 10), "dct")
    s = moments.Scales(counts=0.7, sums=1.3, second=0.9)
    bound = moments.step_mu2(sigma_counts=s.counts, sigma_sums=s.sums, sigma_second=s.second)
    worst_same = worst_move = 0.0
    for trial in range(300):
        X = torch.rand((8, 36), generator=g, dtype=torch.float64) ** 3
        assignment = torch.randint(0, 3, (8,), generator=g)
        X2, assignment2 = X.clone(), assignment.clone()
        X2[0] = torch.rand(36, generator=g, dtype=torch.float64) ** (trial % 5 + 1)
        if trial % 2:
            assignment2[0] = (assignment[0] + 1) % 3
        clip = [0.5, 2.0, 6.0][trial % 3]
        h = [None, 4][trial % 2 == (trial // 2) % 2]
        pooled = trial % 3 == 0
        a = stats(X, assignment, 3, basis, clip, h, pooled)
        b = stats(X2, assignment2, 3, basis, clip, h, pooled)
        value = moved(a, b, s)
        assert value <= bound * (1 + 1e-12)
        same = float(((a.sums - b.sums) ** 2).sum()) <= 2.0 + 1e-12
        assert same
        assert float(((a.second - b.second) ** 2).sum()) <= 2.0 + 1e-12
        if trial % 2:
            worst_move = max(worst_move, value)
        else:
            worst_same = max(worst_same, value)
    assert worst_same > 0 and worst_move > 0


def test_calibration_never_overshoots() -> None:
    """ε of the μ composed by hand from the returned σ's (docs/results/moment_model.md,
    "Sensitivities": the final step 2/σ_c² + 2/σ₁² + 2/σ₂², each DP k-means step 2/σ_s² +
    2/σ_kc²) meets the target, and nearly reaches it."""
    for steps, shares in ((0, moments.Shares()), (4, moments.Shares(kmeans=0.3))):
        for eps in (0.5, 1.0, 10.0):
            s = moments.calibrate(eps, 1e-5, shares, steps)
            mu2 = 2 / s.counts**2 + 2 / s.sums**2 + 2 / s.second**2
            assert s.kmeans_steps == steps
            if steps:
                assert s.kmeans is not None
                mu2 += steps * (2 / s.kmeans.sums**2 + 2 / s.kmeans.counts**2)
            charged = gdp.epsilon_of(math.sqrt(mu2), 1e-5)
            assert charged <= eps * (1 + 1e-12)
            assert charged == pytest.approx(eps, rel=1e-4)


def test_release_rows_in_domain() -> None:
    g = torch.Generator().manual_seed(1)
    X = torch.rand((200, 36), generator=g, dtype=torch.float64)
    y = torch.arange(200) % 3
    generator = SecureRandom.from_seed(3)
    for clusters, kmeans_share, pooled in ((1, 0.0, False), (2, 0.3, False), (1, 0.0, True)):
        options = moments.Options(
            clip=3.0,
            clusters=clusters,
            second_dim=4,
            tail=True,
            pooled=pooled,
            shares=moments.Shares(kmeans=kmeans_share),
        )
        rows, labels, info = moments.release(
            X,
            y,
            3,
            Basis(dct_basis((6, 6), 8), "dct"),
            epsilon=5.0,
            delta=1e-5,
            options=options,
            sampler=FastNoise(generator),
            generator=generator,
        )
        assert rows.shape == (200, 36)
        assert rows.min() >= 0.0 and rows.max() <= 1.0
        assert set(labels.tolist()) <= {0, 1, 2}
        assert float(info["epsilon"]) <= 5.0  # type: ignore[arg-type]


def test_release_secure_sampler_and_nothing_left() -> None:
    """The secure sampler runs the whole release; a budget too small for any cluster to
    survive releases no rows rather than failing."""
    g = torch.Generator().manual_seed(2)
    X = torch.rand((60, 36), generator=g, dtype=torch.float64)
    y = torch.arange(60) % 3
    generator = SecureRandom.from_seed(4)
    for epsilon in (20.0, 0.05):
        rows, labels, _ = moments.release(
            X,
            y,
            3,
            Basis(dct_basis((6, 6), 8), "dct"),
            epsilon=epsilon,
            delta=1e-5,
            options=moments.Options(clip=3.0, fit=moments.FitOptions(min_count=5.0)),
            sampler=SecureNoise(generator),
            generator=generator,
        )
        assert rows.shape[1] == 36 and len(rows) == len(labels) in (0, 60)
        assert rows.size == 0 or (rows.min() >= 0.0 and rows.max() <= 1.0)


def test_sample_nothing_left() -> None:
    model = moments.Model(
        torch.zeros((2, 5), dtype=torch.float64),
        torch.zeros((2, 3, 3), dtype=torch.float64),
        torch.zeros((2, 2), dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
        torch.tensor([0, 1]),
    )
    rows, labels = moments.sample(model, 10, SecureRandom.from_seed(5), 3)
    assert rows.shape == (0, 5) and labels.shape == (0,)


@pytest.mark.parametrize("shrink_diagonal", [True, False])
def test_noisy_variances_shrink_toward_the_pooled_ones(shrink_diagonal: bool) -> None:
    """Each cluster's diagonal target moves toward the clusters' count-weighted variances by the
    known-noise weight: kept when the second moments' noise is negligible, pulled all the way
    in when it dwarfs their differences."""
    generator = torch.Generator().manual_seed(0)
    spreads = torch.tensor([[0.4, 0.2, 0.1, 0.05], [0.05, 0.1, 0.2, 0.4]], dtype=torch.float64)
    assignment = torch.arange(800) % 2
    noise = torch.randn((800, 4), generator=generator, dtype=torch.float64)
    X = (0.5 + spreads[assignment] * noise).clamp(0, 1)
    s = stats(X, assignment, 2, Basis(None, "identity"), 2.0)
    options = moments.FitOptions(shrink_diagonal=shrink_diagonal)
    variances = {}
    for second in (1e-6, 1e3):
        scales = moments.Scales(counts=1.0, sums=1e-6, second=second)
        factors = moments.fit(s, scales, options).factors
        variances[second] = torch.stack([torch.diagonal(f @ f.T) for f in factors])
    exact = variances[1e-6]
    # Negligible noise: each cluster keeps its own variances (they differ by 16× or more).
    assert exact[0, 0] > 10 * exact[0, 3] and exact[1, 3] > 10 * exact[1, 0]
    noisy = variances[1e3]
    if shrink_diagonal:
        pooled = exact.mean(dim=0)  # equal counts
        assert torch.allclose(noisy, pooled.expand(2, 4), rtol=1e-6)
    else:
        assert torch.allclose(noisy, exact, rtol=1e-6)


def test_a_class_too_small_to_keep_is_padded_toward_the_overall_moments() -> None:
    """Threshold τ = 2 × 5 = 10. Class 0 (count 40) is kept as it is; class 1 (noisy count 4,
    below τ) would vanish, and with ``pad_lost_groups`` is kept as its own statistics plus τ
    pseudo-records at every record's noisy mean and second moment (totals over the counts 44)."""
    stats = moments.NoisyMoments(
        counts=torch.tensor([40.0, 4.0], dtype=torch.float64),
        sums=torch.tensor([[40.0, 0.0], [0.0, 4.0]], dtype=torch.float64),
        second=torch.tensor([[40.0, 0.0, 0.0], [0.0, 0.0, 4.0]], dtype=torch.float64),
        groups=torch.tensor([0, 1]),
        second_dim=2,
    )
    dropped = moments.survivors(stats, drop_below=2.0, sigma_counts=5.0)
    assert dropped.groups.tolist() == [0]
    kept = moments.survivors(stats, drop_below=2.0, sigma_counts=5.0, pad_lost_groups=True)
    assert kept.groups.tolist() == [0, 1]
    assert kept.counts.tolist() == [40.0, 14.0]
    overall = torch.tensor([40.0, 4.0], dtype=torch.float64) / 44
    assert torch.allclose(
        kept.sums[1], torch.tensor([0.0, 4.0], dtype=torch.float64) + 10 * overall
    )
    second = torch.tensor([40.0, 0.0, 4.0], dtype=torch.float64) / 44
    assert torch.allclose(
        kept.second[1], torch.tensor([0.0, 0.0, 4.0], dtype=torch.float64) + 10 * second
    )
    # A negative noisy count counts as none: the pseudo-records alone set the count.
    stats = moments.NoisyMoments(
        stats.counts * torch.tensor([1.0, -1.0], dtype=torch.float64),
        stats.sums,
        stats.second,
        stats.groups,
        2,
    )
    assert moments.survivors(
        stats, drop_below=2.0, sigma_counts=5.0, pad_lost_groups=True
    ).counts.tolist() == [40.0, 10.0]


def test_a_variance_lost_in_the_noise_is_floored_at_half_the_pooled_level() -> None:
    """Noise that dwarfs the second moments (σ₂ = 10³ over 800 records) pulls each cluster's
    variances to the pooled ones; a coordinate whose pooled variance is also near zero keeps at
    least half the pooled level (min(noise std, mean pooled variance)), so no class is drawn
    as a constant along it. Without the pooled shrinkage (``shrink_diagonal`` off) the old
    behaviour stays: the cluster's own (zero) variance, floored at 1e-6."""
    generator = torch.Generator().manual_seed(0)
    assignment = torch.arange(800) % 2
    X = torch.full((800, 4), 0.5, dtype=torch.float64)
    spread = 0.2 * torch.randn(800, generator=generator, dtype=torch.float64)
    X[:, 0] = (0.5 + spread * assignment).clamp(0, 1)  # class 1 varies, class 0 is constant
    s = stats(X, assignment, 2, Basis(None, "identity"), 2.0)
    scales = moments.Scales(counts=1.0, sums=1e-6, second=1e3)
    fitted = moments.fit(s, scales, moments.FitOptions())
    variances = torch.stack([torch.diagonal(f @ f.T) for f in fitted.factors])
    exact = moments.fit(s, moments.Scales(1.0, 1e-6, 1e-6), moments.FitOptions()).factors
    own = torch.stack([torch.diagonal(f @ f.T) for f in exact])
    pooled = own.mean(dim=0)  # equal counts
    level = float(pooled.mean())  # below the noise std 10³/800
    floor = 0.5 * torch.clamp(pooled, min=level)
    assert torch.allclose(variances, torch.maximum(pooled, floor).expand(2, 4), rtol=1e-2)
    assert bool((variances[0] >= 0.5 * level * (1 - 1e-2)).all())
    plain = moments.fit(s, scales, moments.FitOptions(shrink_diagonal=False)).factors
    assert float(torch.diagonal(plain[0] @ plain[0].T)[1]) <= 1e-6 * (1 + 1e-9)
