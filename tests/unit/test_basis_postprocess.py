"""The public basis (a contraction with a rounding bound) and the free post-processing (a
function of the released rows and public facts that removes noise)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from dpcore.mechanisms.basis import Basis, BasisParams, basis_for, check, dct_basis
from dpcore.mechanisms.postprocess import Denoiser, postprocessor, simplex
from dpcore.mechanisms.spec import InvalidParams, PublicFacts


@pytest.mark.parametrize(("shape", "k"), [((28, 28), 64), ((5, 7), 35), ((10,), 4)])
def test_dct_basis_has_orthonormal_columns_lowest_frequency_first(
    shape: tuple[int, ...], k: int
) -> None:
    B = dct_basis(shape, k)
    d = int(np.prod(shape))
    assert B.shape == (d, k)
    assert np.abs(B.T @ B - np.eye(k)).max() < 1e-12
    # The first function is the constant (the row's mean direction).
    assert np.allclose(B[:, 0], 1 / np.sqrt(d))
    if len(shape) == 2:
        # Zig-zag: the next two are the lowest horizontal and vertical frequencies.
        image = B[:, 1].reshape(shape)
        assert np.allclose(image, image[:1, :])  # every row alike: a horizontal wave
        assert not np.allclose(image, image[:, :1])
        image = B[:, 2].reshape(shape)
        assert np.allclose(image, image[:, :1])  # constant along each row: a vertical wave


def test_projection_never_moves_neighbours_apart() -> None:
    rng = np.random.default_rng(0)
    B = dct_basis((6, 6), 10)
    basis = Basis(B, "test")
    x = rng.random((500, 36))
    y = rng.random((500, 36))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    y /= np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1.0)
    zx = basis.project(torch.tensor(x)).numpy()
    zy = basis.project(torch.tensor(y)).numpy()
    moved = np.linalg.norm(zx - zy, axis=1)
    assert (moved <= np.linalg.norm(x - y, axis=1) + basis.excess(np.sqrt(2), 1.0)).all()
    # The rounding cover is tiny but not zero (B is only orthonormal up to rounding).
    assert 0 < basis.excess(np.sqrt(2), 1.0) < 1e-10
    assert Basis(None, "identity").excess(1.0, 1.0) == 0.0


def test_float32_storage_of_projections_stays_within_its_cover() -> None:
    """``project_stored`` rows: longer than the rows by at most ``stored_norm``'s factor, and
    two neighbours' rows further apart than the float64 projections by ≤ ``stored_excess``.
    Rows of norm exactly 1 with large coordinates make the storage's rounding largest; the
    cover is tight enough that ten times less would not hold."""
    basis = Basis(dct_basis((28, 28), 64), "dct")
    rng = np.random.default_rng(3)
    x = rng.random((400, 784)) ** 8
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.random((400, 784)) ** 8
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    zx64, zy64 = (basis.project(torch.tensor(v)).numpy() for v in (x, y))
    zx, zy = (basis.project_stored(torch.tensor(v)).double().numpy() for v in (x, y))
    assert basis.project_stored(torch.tensor(x)).dtype == torch.float32
    assert (np.linalg.norm(zx, axis=1) <= basis.stored_norm(1.0)).all()
    extra = np.linalg.norm(zx - zy, axis=1) - np.linalg.norm(zx64 - zy64, axis=1)
    assert (extra <= basis.stored_excess(1.0)).all()
    # Storage moves a row by up to 2⁻²⁴ of its norm: the cover is of that order, not looser.
    assert np.max(np.linalg.norm(zx - zx64, axis=1)) > basis.stored_excess(1.0) / 20
    identity = Basis(None, "identity")
    assert identity.stored_excess(1.0) == 0.0 and identity.stored_norm(1.0) == 1.0


def test_lift_inverts_project_on_the_span() -> None:
    basis = Basis(dct_basis((4, 4), 16), "rotation")
    x = torch.rand(20, 16, dtype=torch.float64)
    assert torch.allclose(basis.lift(basis.project(x), torch.float64), x, atol=1e-12)


def test_auto_basis_is_dct_on_images_identity_on_flat_or_small_data() -> None:
    auto = BasisParams()
    assert basis_for(auto, (28, 28), 784, 64).matrix.shape == (784, 64)  # type: ignore[union-attr]
    assert basis_for(auto, (784,), 784, 64).identity
    assert basis_for(auto, (8, 8), 64, 64).identity  # nothing to drop
    assert basis_for(BasisParams(basis="identity"), (28, 28), 784, 64).identity
    flat = basis_for(BasisParams(basis="dct", basis_dim=5), (12,), 12, 64)
    assert flat.matrix is not None and flat.matrix.shape == (12, 5)


def test_basis_params_are_validated_and_checked_against_public_facts() -> None:
    with pytest.raises(ValidationError):
        BasisParams(basis="identity", basis_dim=4)
    with pytest.raises(ValidationError):
        BasisParams(basis="dct", basis_dim=0)
    facts = PublicFacts(n=100, n_features=10, n_classes=2)
    check(BasisParams(basis="dct", basis_dim=10), facts)
    with pytest.raises(InvalidParams, match="basis_dim 11 exceeds"):
        check(BasisParams(basis="dct", basis_dim=11), facts)


def test_simplex_projection_is_the_nearest_distribution() -> None:
    rng = np.random.default_rng(1)
    Y = rng.normal(0.2, 0.5, size=(200, 3))
    P = simplex(Y)
    assert np.allclose(P.sum(axis=1), 1.0)
    assert (P >= 0).all()
    # Brute force over a fine grid of the 2-simplex: nothing is nearer.
    grid = np.array(
        [(a, b, 1 - a - b) for a, b in itertools.product(np.linspace(0, 1, 101), repeat=2)]
    )
    grid = grid[grid[:, 2] >= -1e-12]
    for y, p in zip(Y[:20], P[:20], strict=True):
        assert np.linalg.norm(y - p) <= np.linalg.norm(grid - y, axis=1).min() + 1e-9
    # Points already on the simplex stay.
    assert np.allclose(simplex(P), P)


def _low_rank_release(
    sigma: float, *, classes: int = 1, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signals on a class-dependent 3-dimensional subspace of R^40 in [0, 1], plus noise."""
    rows, d = 3000, 40
    labels = rng.integers(0, classes, size=rows)
    means = rng.uniform(0.3, 0.5, size=(classes, d))
    directions = rng.normal(size=(classes, 3, d)) * 0.05
    coef = rng.normal(size=(rows, 3))
    signal = means[labels] + np.einsum("rk,rkd->rd", coef, directions[labels])
    signal = np.clip(signal, 0, 1)
    Y = np.eye(classes)[labels]
    return signal, signal + rng.normal(0, sigma, size=signal.shape), Y


@pytest.mark.parametrize("classes", [1, 3])
def test_denoising_brings_rows_nearer_their_signal(classes: int) -> None:
    rng = np.random.default_rng(2)
    signal, noisy, Y = _low_rank_release(0.3, classes=classes, rng=rng)
    post = Denoiser(
        sigma=0.3,
        basis=Basis(None, "identity"),
        grouped=classes > 1,
        unit_box=True,
        max_norm=10.0,
        noisy_labels=False,
    )
    for start in range(0, len(noisy), 700):  # any chunking
        post.fit(noisy[start : start + 700], Y[start : start + 700])
    X, Y_out = post.transform(noisy, Y)
    before = np.linalg.norm(noisy - signal, axis=1).mean()
    after = np.linalg.norm(X - signal, axis=1).mean()
    assert after < 0.25 * before, (before, after)
    assert np.array_equal(Y_out, Y.astype(np.float32))  # exact labels are kept
    assert X.min() >= 0 and X.max() <= 1


def test_denoising_at_a_wrong_noise_level_removes_less() -> None:
    """The public σ is what drives the shrinkage: told there is no noise, it changes nothing
    but the domain clip."""
    rng = np.random.default_rng(3)
    _, noisy, Y = _low_rank_release(0.3, rng=rng)
    post = Denoiser(
        sigma=0.0,
        basis=Basis(None, "identity"),
        grouped=False,
        unit_box=False,
        max_norm=1e9,
        noisy_labels=False,
    )
    post.fit(noisy, Y)
    X, _ = post.transform(noisy, Y)
    assert np.allclose(X, noisy, atol=1e-5)


def test_denoising_in_a_basis_clips_to_the_domain_and_projects_noisy_labels() -> None:
    rng = np.random.default_rng(4)
    basis = Basis(dct_basis((5, 8), 6), "dct")
    Z = rng.normal(0.5, 1.0, size=(400, 6))
    X_raw = basis.lift(torch.tensor(Z), torch.float64).numpy()
    Y_raw = rng.normal(0.1, 0.4, size=(400, 4))
    post = postprocessor(
        "denoise",
        sigma=1.0,
        basis=basis,
        grouped=False,
        unit_box=True,
        max_norm=1.0,
        noisy_labels=True,
    )
    assert post is not None
    post.fit(X_raw, Y_raw)
    X, Y = post.transform(X_raw, Y_raw)
    assert X.min() >= 0 and X.max() <= 1
    assert (np.linalg.norm(X, axis=1) <= 1 + 1e-6).all()
    assert np.allclose(Y.sum(axis=1), 1, atol=1e-6) and Y.min() >= 0
    assert (
        postprocessor(
            "none",
            sigma=1.0,
            basis=basis,
            grouped=False,
            unit_box=True,
            max_norm=1.0,
            noisy_labels=True,
        )
        is None
    )


def test_transform_needs_fit() -> None:
    post = Denoiser(1.0, Basis(None, "i"), False, True, 1.0, False)
    with pytest.raises(ValueError, match="fit before transform"):
        post.transform(np.zeros((2, 3)), np.zeros((2, 2)))


def test_shrinkage_drops_pure_noise_and_tends_to_wiener_for_many_rows() -> None:
    from dpcore.mechanisms.postprocess import shrinkage_gain

    rng = np.random.default_rng(5)
    noise = rng.normal(0, 0.3, size=(1000, 256))
    centred = noise - noise.mean(axis=0)
    squares = np.linalg.eigvalsh(centred.T @ centred)
    # Pure noise: every eigenvalue is inside the bulk, nothing is kept (the Wiener gain
    # (λ − σ²)/λ would keep the top ones at up to ~0.55).
    assert shrinkage_gain(squares, rows=1000, dims=256, sigma=0.3).max() == 0.0
    wiener_top = 1 - 0.09 / (squares.max() / 999)
    assert wiener_top > 0.4
    # Many rows, few dimensions: the gain is (λ − σ²)/λ.
    squares = np.array([4.0, 2.0, 1.0]) * 1e6
    gain = shrinkage_gain(squares, rows=10**6, dims=3, sigma=1.0)
    assert np.allclose(gain, [0.75, 0.5, 0.0], atol=3e-3)


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("dpmix", {"mixture_degree": 4, "n_samples": 200, "postprocess": "denoise"}),
        # Its default k (256) is ≥ d here, where auto keeps the identity: ask for 36.
        (
            "dpcda",
            {
                "mixture_degree": 4,
                "n_samples": 200,
                "min_class_size": 4,
                "basis_dim": 36,
                "postprocess": "denoise",
            },
        ),
        ("sgdrm", {"mixture_width": 4, "n_samples": 200, "postprocess": "denoise"}),
    ],
)
def test_mechanisms_release_in_the_auto_basis_and_post_process(
    mechanism: str, params: dict[str, object]
) -> None:
    """Image-shaped data: the default basis is a DCT (rows lie in its k-dimensional span);
    the post-processing (opt-in) maps the drawn rows and keeps what it must keep."""
    from dpcore.mechanisms.noise import FastNoise
    from dpcore.mechanisms.run import build, facts_of, materialise, noise_for
    from dpcore.mechanisms.secure_random import SecureRandom
    from service.datasets.parsing import ParsedDataset

    rng = np.random.default_rng(6)
    X = rng.random((120, 100))
    data = ParsedDataset(
        X=X,
        feature_shape=(10, 10),
        feature_names=[f"p{i}" for i in range(100)],
        labels=rng.integers(0, 2, size=120),
        classes=[0, 1],
        classes_declared=True,
        lo=np.zeros(100),
        hi=np.ones(100),
        clipped_values=0,
    )
    sigma_y = 0.5 if mechanism == "dpmix" else None  # the one with a label scale
    noise = noise_for(mechanism, params, facts_of(data), sigma=0.5, sigma_y=sigma_y)
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=FastNoise(SecureRandom.from_seed(1)),
        generator=SecureRandom.from_seed(2),
        device=torch.device("cpu"),
    )
    assert out.preprocessing["basis"].startswith("dct: rows projected on the first")
    assert out.postprocess is not None
    X_out, Y_out, X_raw, Y_raw = materialise(out)
    B = dct_basis((10, 10), int(params.get("basis_dim", 64)))  # type: ignore[call-overload]
    # Drawn rows lie in the basis's span (k < d for dpmix and sgdrm).
    assert np.abs(X_raw - (X_raw @ B) @ B.T).max() < 1e-4
    assert not np.allclose(X_out, X_raw)
    if mechanism == "sgdrm":  # signed combinations: labels as drawn, no domain clip
        assert np.array_equal(Y_out, Y_raw) and X_out.min() < 0
    elif mechanism == "dpcda":  # exact labels kept
        assert np.array_equal(Y_out, Y_raw) and X_out.min() >= 0
    else:
        assert np.allclose(Y_out.sum(axis=1), 1, atol=1e-5) and X_out.min() >= 0


@pytest.mark.parametrize("mechanism", ["dpmix", "dpcda", "sgdrm"])
def test_post_processing_is_opt_in(mechanism: str) -> None:
    """By default a mixing mechanism releases its rows as drawn (the measured default: denoise
    helps some model families and ruins others, docs/results/sweet_spot.md)."""
    from dpcore.mechanisms import registry

    spec = registry.get(mechanism)
    assert spec.params.model_fields["postprocess"].default == "none"
