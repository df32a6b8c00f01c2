"""ClustMix variant paper (Algorithm 2): the exact size-constrained assignment, random slicing,
the GMM, KIP's loss and kernels, and the release job on a small dataset."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms import registry
from dpcore.mechanisms.apportion import apportion
from dpcore.mechanisms.clustmix import paper
from dpcore.mechanisms.clustmix.accounting import ClustMixPaperEvent, paper_sensitivity
from dpcore.mechanisms.clustmix.params import ClustMixParams
from dpcore.mechanisms.contract import RunContext
from dpcore.mechanisms.noise import DeclaredNoise, FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset
from tests.datasets import unit_dataset

pytestmark = pytest.mark.unit

PAPER = registry.accountant("clustmix", "paper")
CPU = torch.device("cpu")


# ---- the constrained assignment ---------------------------------------------------------


def _brute_force(cost: np.ndarray, least: int) -> float:
    m, n = cost.shape
    best = math.inf
    for z in itertools.product(range(n), repeat=m):
        if min(np.bincount(z, minlength=n)) >= least:
            best = min(best, float(cost[np.arange(m), z].sum()))
    return best


@pytest.mark.parametrize(("m", "n", "least", "seed"), [(6, 2, 3, 0), (7, 2, 3, 1), (9, 3, 2, 2)])
def test_constrained_assignment_is_optimal(m: int, n: int, least: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(5):
        cost = rng.exponential(1.0, (m, n))
        cost[:, 0] *= 0.2  # unconstrained, most records would take cluster 0
        z = paper.constrained_assignment(torch.as_tensor(cost), least).numpy()
        assert np.bincount(z, minlength=n).min() >= least
        assert cost[np.arange(m), z].sum() == pytest.approx(_brute_force(cost, least))


def test_constrained_assignment_fills_every_cluster() -> None:
    rng = np.random.default_rng(3)
    cost = torch.as_tensor(rng.uniform(0, 1, (53, 5)))
    cost[:, 2] -= 10  # every record prefers cluster 2
    z = paper.constrained_assignment(cost, 10)
    sizes = torch.bincount(z, minlength=5)
    # Each other cluster gets exactly its 10; the 13 spare records stay with cluster 2.
    assert sizes.tolist() == [10, 10, 13, 10, 10]
    with pytest.raises(ValueError, match="need 60 > 53"):
        paper.constrained_assignment(cost, 12)


def test_random_slices_partition_a_class_into_big_enough_regions() -> None:
    rng = np.random.default_rng(4)
    X = torch.as_tensor(rng.uniform(0, 1, (103, 4)))
    parts = paper.random_slices(X, 20, 30, SecureRandom.from_seed(1))
    assert len(parts) == 3  # round(103 / 30)
    assert sorted(torch.cat(parts).tolist()) == list(range(103))
    assert sorted(len(p) for p in parts) == [34, 34, 35]
    # Too few records for round(m / slice_rows) regions of ≥ l: fewer regions.
    assert len(paper.random_slices(X, 40, 10, SecureRandom.from_seed(1))) == 2
    assert len(paper.random_slices(X, 60, 10, SecureRandom.from_seed(1))) == 1


def test_gmm_separates_blobs() -> None:
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(0.2, 0.02, (30, 3)), rng.normal(0.7, 0.02, (40, 3))])
    z = paper.approximate(torch.as_tensor(X), 25, 20, SecureRandom.from_seed(2)).numpy()
    # Two clusters of ≥ 25: the 30 and the 40 of the blobs, each cluster within one blob.
    assert sorted(np.bincount(z).tolist()) == [30, 40]
    assert len(set(z[:30])) == 1 and len(set(z[30:])) == 1
    # Size-constrained k-means (gmm_iters = 0) keeps the constraint too.
    z = paper.approximate(torch.as_tensor(X), 30, 0, SecureRandom.from_seed(2)).numpy()
    assert np.bincount(z).min() >= 30 and len(np.bincount(z)) == 2


# ---- KIP --------------------------------------------------------------------------------


def test_ntk_values_symmetry_psd_and_finite_gradients() -> None:
    # Depth 1, no bias, unit inputs: Θ(x, x) = Σ⁰Σ̇ + Σ¹ = 1 + 1; orthogonal: 0 + 1/π.
    e = torch.eye(2, dtype=torch.float64)
    K = paper.ntk_kernel(e, e, 1, bias=0.0)
    assert K[0, 0].item() == pytest.approx(2.0, abs=1e-5)
    assert K[0, 1].item() == pytest.approx(1 / math.pi, abs=1e-9)
    rng = np.random.default_rng(6)
    A = torch.as_tensor(rng.uniform(0, 1, (24, 5)) / 3.0)
    A[0] = 0.0  # an all-zero record
    A[2] = A[1]  # a repeated one
    A.requires_grad_(True)
    for depth in (1, 3):
        K = paper.ntk_kernel(A, A, depth)
        assert torch.allclose(K, K.T, rtol=1e-12, atol=1e-12)
        assert torch.linalg.eigvalsh(K.detach()).min() >= -1e-9 * K.detach().abs().max()
        (grad,) = torch.autograd.grad(K.sum(), A)
        assert torch.isfinite(grad).all()
    R = paper.rbf_kernel(A.detach(), A.detach(), 0.5)
    assert torch.diagonal(R).tolist() == pytest.approx([1.0] * 24)
    assert torch.linalg.eigvalsh(R).min() >= -1e-9


def _toy(sizes: tuple[int, ...] = (90, 70, 15), d: int = 6) -> ParsedDataset:
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    X = rng.uniform(0, 1, (len(labels), d)) * 0.3
    X[np.arange(len(labels)), labels] += 0.7  # one bright feature per class
    return unit_dataset(X, labels, len(sizes))


@pytest.mark.parametrize("kernel", ["rbf", "ntk"])
def test_kip_loss_decreases_under_adam(kernel: str) -> None:
    data = _toy()
    features = paper.paper_features(data, CPU)
    X_t = features.double()
    y_t = torch.nn.functional.one_hot(torch.as_tensor(data.labels), 3).double()
    # A poor support set: one point per class, each pulled towards the others' mean.
    anchor = torch.stack([X_t[data.labels == c].mean(0) for c in range(3)])
    anchor = 0.5 * anchor + 0.5 * X_t.mean(0)
    y_s = torch.eye(3, dtype=torch.float64)
    params = ClustMixParams(variant="paper", kernel=kernel, kernel_width=0.3, ridge=1e-2)
    loss = lambda X: paper.kip_loss(  # noqa: E731
        X, anchor, y_s, X_t, y_t, alpha=0.3, ridge=params.ridge, kernel=paper.kernel_of(params)
    )
    X = anchor.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([X], lr=0.01)
    start = loss(X).item()
    for _ in range(30):
        optimiser.zero_grad()
        value = loss(X)
        value.backward()
        optimiser.step()
    assert loss(X).item() < 0.9 * start
    # At the anchor the distance term is 0: α = 1 leaves the loss flat there.
    zero = paper.kip_loss(
        anchor, anchor, y_s, X_t, y_t, alpha=1.0, ridge=1e-2, kernel=paper.kernel_of(params)
    )
    assert zero.item() == 0.0


# ---- the release ------------------------------------------------------------------------


class Shift:
    """A deterministic "sampler": adds exactly σ to every entry, and records its calls."""

    name = "fast"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append(kwargs)
        return values + kwargs["sigma"]


LEAST = 20


def _params(**extra: Any) -> dict[str, Any]:
    return {"variant": "paper", "cluster_size": LEAST, "slice_rows": 40, "kip_steps": 20, **extra}


def _context(params: dict[str, Any], data: ParsedDataset, sampler: Any, seed: int) -> RunContext:
    noise = noise_for("clustmix", params, facts_of(data), sigma=0.3, accountant="paper")
    return RunContext(
        noise=noise,
        sampler=DeclaredNoise(sampler, noise),
        generator=SecureRandom.from_seed(seed),
        device=CPU,
    )


def _release(params: dict[str, Any], sampler: Any, seed: int = 4) -> tuple[Any, Any]:
    data = _toy()
    noise = noise_for("clustmix", params, facts_of(data), sigma=0.3, accountant="paper")
    out = build(
        "clustmix",
        params,
        data,
        noise=noise,
        sampler=sampler,
        generator=SecureRandom.from_seed(seed),
        device=CPU,
    )
    rows = list(out.chunks)
    X = torch.cat([x for x, _ in rows]).double() if rows else torch.zeros((0, 6))
    Y = torch.cat([y for _, y in rows]) if rows else torch.zeros((0, 3))
    return out, (X, Y)


def _clusters(params: dict[str, Any], seed: int = 4) -> paper.Clustering:
    """The clustering a release with the same seed finds (the noise draws come after it)."""
    data = _toy()
    ctx = _context(params, data, Shift(), seed)
    features = paper.paper_features(data, CPU)
    return paper.clustering(
        ClustMixParams.model_validate(params),
        features,
        torch.as_tensor(data.labels),
        3,
        LEAST,
        ctx,
    )


def test_release_rows_are_cluster_means_with_eq8_noise_per_cluster() -> None:
    params = _params()
    sampler = Shift()
    out, (X, Y) = _release(params, sampler)
    found = _clusters(params)
    sizes = found.sizes()
    # Class 0 (90 records): 2 regions of 45, 2 clusters each; class 1 (70): 2 of 35, 1 each;
    # class 2 (15 < l): none, its records unused.
    assert found.classes.tolist() == [0, 0, 0, 0, 1, 1]
    assert found.skipped == [2] and "classes [2]" in out.preprocessing["clusters"]
    assert out.rows == len(X) == 6 and out.progress == "own"
    assert sizes.min() >= LEAST and int(sizes.sum()) == 160
    assert (found.members[160:] == -1).all()
    # Labels: the clusters' classes, exactly one-hot.
    assert Y.tolist() == torch.nn.functional.one_hot(found.classes, 3).float().tolist()
    # One sampler call at the declared σ and sensitivity, on the sums over l ...
    sigma = 0.3
    assert [c["sigma"] for c in sampler.calls] == [sigma]
    assert sampler.calls[0]["sensitivity"] == paper_sensitivity(LEAST, 6)
    assert 0 < sampler.calls[0]["error"] < 1e-6
    # ... so each row is its cluster's mean plus noise of std σ·l/N_t (here exactly that).
    features = paper.paper_features(_toy(), CPU).double()
    event = ClustMixPaperEvent(LEAST, 3, 6, sigma)
    for t in range(6):
        mean = features[found.members == t].mean(0)
        offset = event.cluster_sigma(int(sizes[t]))
        assert offset == pytest.approx(sigma * LEAST / int(sizes[t]))
        assert X[t].tolist() == pytest.approx((mean + offset).tolist(), abs=1e-6)


def test_release_is_not_clipped_and_keeps_classes_apart() -> None:
    generator = SecureRandom.from_seed(9)
    _, (X, _) = _release(_params(), FastNoise(generator))
    # Noise σ_t ≤ 0.3 per feature, unclipped: some entries leave [0, 1].
    assert X.min() < 0 or X.max() > 1
    _, (X, Y) = _release(_params(kernel="ntk", gmm_iters=0, alpha=0.2), Shift())
    assert len(X) == 6 and (X[:, :2].argmax(1) == Y[:, :2].argmax(1)).all()


def test_alpha_one_keeps_the_gmm_centroids() -> None:
    found = _clusters(_params(alpha=1.0))
    assert torch.equal(found.adapted, found.centroids)
    adapted = _clusters(_params(alpha=0.0, kip_lr=0.05))
    assert not torch.allclose(adapted.adapted, adapted.centroids)
    assert adapted.sizes().min() >= LEAST


def test_n_samples_repeats_clusters_by_their_sizes() -> None:
    out, (X, _) = _release(_params(n_samples=32, alpha=1.0), Shift())
    sizes = _clusters(_params(alpha=1.0)).sizes().numpy()
    assert out.rows == len(X) == 32
    # Rows per cluster follow the exact sizes (largest remainders); clusters' rows differ.
    counts = np.unique(X.numpy(), axis=0, return_counts=True)[1]
    assert sorted(counts.tolist()) == sorted(apportion(sizes.astype(float), 32).tolist())


def test_no_class_large_enough_releases_nothing() -> None:
    out, (X, _) = _release(_params(cluster_size=100), Shift())
    assert out.rows == 0 and len(X) == 0


def test_cluster_size_comes_from_the_params_or_the_accountant() -> None:
    scale = NoiseScale("means", 0.3, paper_sensitivity(LEAST, 6), ("features",))
    params = ClustMixParams(variant="paper", sigma_max=0.5)
    with_l = NoiseDescription((scale,), "means", analysis={"cluster_size": LEAST})
    ctx = RunContext(with_l, Shift(), SecureRandom.from_seed(0), CPU)
    assert paper.cluster_size(params, ctx) == LEAST
    ctx.noise = NoiseDescription((scale,), "means")
    with pytest.raises(ValueError, match="needs cluster_size"):
        paper.cluster_size(params, ctx)
    assert paper.cluster_size(ClustMixParams(variant="paper", cluster_size=7), ctx) == 7


def test_records_are_in_the_papers_domain_and_test_rows_follow() -> None:
    """Algorithm 2 takes x ∈ [0, 1]^D (rows not rescaled); evaluation maps real rows alike."""
    from dpcore.mechanisms.clustmix.release import preprocess_test

    data = _toy()
    features = paper.paper_features(data, CPU).double().numpy()
    assert features.min() >= 0 and features.max() <= 1
    assert np.linalg.norm(features, axis=1).max() > 1  # not scaled to norm ≤ 1
    meta = {"feature_range": {"lo": data.lo.tolist(), "hi": data.hi.tolist()}}
    paper_rows = preprocess_test({**meta, "params": {"variant": "paper"}}, {}, data.X)
    assert paper_rows == pytest.approx(features)
    dp_rows = preprocess_test({**meta, "params": {"variant": "dp"}}, {}, data.X)
    assert np.linalg.norm(dp_rows, axis=1).max() <= 1 + 1e-12
    # The declared sensitivity is the [0, 1]^D one: √D·max(1/l, √2/(l + 1)).
    event = ClustMixPaperEvent(LEAST, 3, 6, 0.3)
    assert event.noise().scales[0].sensitivity == pytest.approx(
        np.sqrt(6) * max(1 / LEAST, np.sqrt(2) / (LEAST + 1))
    )


def test_regions_stay_within_slice_rows_and_the_assignment_cap() -> None:
    generator = SecureRandom.from_seed(3)
    X = torch.rand((2500, 4), dtype=torch.float64)
    parts = paper.random_slices(X, 10, 1000, generator)
    assert len(parts) == 2 and max(len(p) for p in parts) <= 1500
    assert sorted(torch.cat(parts).tolist()) == list(range(2500))
    # l_min above slice_rows: regions of < 2·l_min records; past the cap, a clear refusal.
    assert all(len(p) >= 1200 for p in paper.random_slices(X, 1200, 1000, generator))
    big = torch.rand((paper.MAX_REGION + 2, 2), dtype=torch.float64)
    with pytest.raises(ValueError, match="smaller cluster_size"):
        paper.random_slices(big, paper.MAX_REGION // 2 + 2, 1000, generator)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"variant": "paper", "sigma_max": 1.0},
        {"variant": "paper", "clusters_per_class": 3},
        {"variant": "dp", "alpha": 0.2},
        {"alpha": 0.5},
        {"cluster_size": 5},
        {"variant": "paper", "spread": 0.0, "kernel": "ntk"},
    ],
)
def test_the_schema_states_the_variant_rule(body: dict[str, Any]) -> None:
    """A params body valid by the published JSON schema is one the spec accepts, and back."""
    import jsonschema

    from dpcore.mechanisms.clustmix.params import foreign_fields

    schema = ClustMixParams.model_json_schema()
    by_schema = jsonschema.Draft202012Validator(schema).is_valid(body)
    assert by_schema == (not foreign_fields(ClustMixParams.model_validate(body)))
