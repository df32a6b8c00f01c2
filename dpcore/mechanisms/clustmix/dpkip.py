"""DP-KIP: the KIP adaptation of ClustMix's centres by DP-SGD (variant ``dp``).

KIP (Nguyen, Chen, Lee 2021; the paper's Eq. 6 with α = 0) moves a labelled support set X_s —
here the DP k-means centres, each labelled by its class — so that kernel ridge regression from
it predicts the real records' labels: for a record (x, y),

    ℓ(X_s; x, y) = ‖k(x, X_s)·A − y‖²,  A = (K_ss + λI)⁻¹ Y_s,  k the rbf kernel of width w.

DP-KIP (Vinaroz and Park 2023) runs SGD on this loss with DP-SGD: each step draws a Poisson
batch (every record independently with probability q = L/n, exactly, from the release's secure
source: the sampler the accountant assumes), clips every record's gradient (all of X_s's
coordinates as one vector) to norm C, adds N(0, (zC)²) to each coordinate of the batch's sum
and divides by the expected batch L (public). Adam then moves X_s on the noisy gradient
(post-processing). X_s, K_ss and A are functions of public centres: a record's gradient reads
only that record, so replacing it moves the clipped sum by ≤ 2C — the Poisson-subsampled
Gaussian of ``accounting.ClustMixDPKIPEvent``.

Per-record gradients in closed form (checked against autograd in the tests): with u = k(x, X_s),
v = (K_ss + λI)⁻¹u, r = uᵀA − y, a = A r and S = (v aᵀ + a vᵀ) ⊙ K_ss, the gradient with
respect to centre p is (2/w²)·[a_p u_p (x − x_p) + (Σ_l S_pl) x_p − (S X_s)_p]. Computing it
for a chunk of records costs chunk × m² memory, not the chunk × m³ of differentiating the solve
per record (``torch.func.vmap`` of autograd would).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.clustmix.distances import square_distances
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom

# The clipped sum's sensitivity in units of C (a record replaced: −g(x) + g(x′), each ≤ C).
SENSITIVITY = 2.0
# One record's clipped gradient (norm ≤ 1 in units of C): the Poisson-subsampled Gaussian's
# contribution bound, which the sampler's rounding cover is relative to (not Δ = 2).
RADIUS = 1.0
# Records whose gradients are formed at once (memory ≈ chunk × (m² + m·k) floats).
CHUNK = 64


@dataclass(frozen=True)
class KIPSettings:
    steps: int
    batch: int
    clip: float
    lr: float
    ridge: float
    width: float
    noise_multiplier: float


def rbf(a: torch.Tensor, b: torch.Tensor, width: float) -> torch.Tensor:
    """exp(−‖a_i − b_j‖²/(2w²)), (len(a), len(b)): w the bandwidth itself (the paper
    variant's ``rbf_kernel`` takes a width per feature)."""
    return torch.exp(-square_distances(a, b) / (2.0 * width * width))


def per_record_gradients(
    support: torch.Tensor,
    labels: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    ridge: float,
    width: float,
) -> torch.Tensor:
    """∇_{X_s} ℓ(X_s; x_i, y_i) for each record i: (b, m, k) (module docstring)."""
    m = support.shape[0]
    K = rbf(support, support, width)
    M = K + ridge * torch.eye(m, dtype=K.dtype, device=K.device)
    chol = torch.linalg.cholesky(M)
    A = torch.cholesky_solve(labels, chol)  # (m, C)
    U = rbf(x, support, width)  # (b, m)
    V = torch.cholesky_solve(U.T, chol).T  # (b, m): M⁻¹u per record (M symmetric)
    a = (U @ A - y) @ A.T  # (b, m)
    first = (a * U)[:, :, None] * (x[:, None, :] - support[None, :, :])
    S = (V[:, :, None] * a[:, None, :] + a[:, :, None] * V[:, None, :]) * K[None, :, :]
    second = S.sum(2)[:, :, None] * support[None, :, :] - S @ support
    return (2.0 / (width * width)) * (first + second)


Progress = Callable[[int, int], None]


def adapt(
    Z: torch.Tensor,
    groups: torch.Tensor,
    n_classes: int,
    support: torch.Tensor,
    support_groups: torch.Tensor,
    settings: KIPSettings,
    *,
    sampler: NoiseSampler,
    generator: SecureRandom,
    progress: Progress | None = None,
) -> torch.Tensor:
    """The centres ``support`` (m, k) after ``settings.steps`` DP-KIP steps on the records ``Z``
    (n, k) of classes ``groups`` (module docstring); float64, on Z's device."""
    n = Z.shape[0]
    # Clipped rows of norm ≤ 1 in units of C, at most n of them, summed in float64: the
    # summation's rounding is what the sampler covers beyond the sensitivity. Bounded with n
    # terms (not the batch's own size) so that every step has the same noise plan: the secure
    # sampler builds its table once, not once per batch size.
    error = float_error.scaled_sum(SENSITIVITY, terms=n, magnitude=float(n))
    eye = torch.eye(n_classes, dtype=torch.float64, device=Z.device)
    labels = eye[support_groups]
    centres = support.detach().clone().double().requires_grad_(True)
    optimiser = torch.optim.Adam([centres], lr=settings.lr)
    for index in range(settings.steps):
        chosen = generator.bernoulli(settings.batch, n, (n,))
        rows = torch.as_tensor(chosen.nonzero()[0], device=Z.device)
        total = torch.zeros_like(centres, dtype=torch.float64).detach()
        current = centres.detach()
        for start in range(0, len(rows), CHUNK):
            part = rows[start : start + CHUNK]
            grads = per_record_gradients(
                current,
                labels,
                Z[part].double(),
                eye[groups[part]],
                ridge=settings.ridge,
                width=settings.width,
            )
            norms = grads.flatten(1).norm(dim=1)
            factor = (settings.clip / norms.clamp_min(1e-300)).clamp(max=1.0)
            total += (grads * factor[:, None, None]).sum(0)
        flat = (total / settings.clip).reshape(1, -1)
        noisy = sampler(
            flat,
            sigma=settings.noise_multiplier,
            sensitivity=SENSITIVITY,
            error=error,
            unit=RADIUS,
        )
        optimiser.zero_grad()
        centres.grad = noisy.reshape(centres.shape).double() * settings.clip / settings.batch
        optimiser.step()
        if progress is not None:
            progress(index + 1, settings.steps)
    return centres.detach()
