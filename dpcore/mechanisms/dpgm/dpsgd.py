"""DP-SGD with adaptive clipping (the paper's Algorithms 3 and 4), for M networks at once.

Every step, exactly as ``accounting.DPGMEvent`` assumes:

1. **Poisson batch.** Each of the n records joins independently with probability q = L/n
   exactly (``SecureRandom.bernoulli(L, n)``), whatever its cluster — not the paper's Alg. 1
   line 4, which picks one cluster with probability |D̂_s|/|D| (a private size). Each record
   then trains the network of its own cluster; all M networks step together.
2. **DPNorm** (Alg. 3): every batch record's gradient norm falls in one of w bins of
   (0, C_max] (norms above C_max in the last); the histogram gets N(0, σ_C²) per bin (a record
   replaced moves one count from one bin to another: √2) and the threshold C is the upper edge
   of the noisy mode. One histogram and one C per step for all networks: a record is in one
   bin of one histogram either way, and a shared histogram holds L records, not L/M.
3. **Clip and noise.** Each record's gradient (the whole parameter vector of its network) is
   scaled to norm ≤ C; the clipped sums of all networks, in units of C, form ONE vector to
   which N(0, σ_S²) is added per coordinate (a record replaced moves its network's block by
   ≤ 1 and the other record's by ≤ 1: 2 in all). Networks without a batch record get noise
   only: the released vector does not say which networks the batch reached.
4. **Descent.** Network m's gradient is its noisy block × C over q·n̂_m, n̂_m its cluster's
   noisy size (released before training): post-processing. Adam (vae) or SGD (rbm).

Rounding: the clipped rows are summed in float64; their rounding is bounded over n terms (not
the batch's own size) so that every step has the same noise plan, and covered by the sampler
relative to one record's contribution (``*_RADIUS``), the bound the accountant's noise
multiplier is stated for — not the replace-one Δ, twice as large, whose cover would leave a
rounded contribution of norm 1 + b under noise raised by only 1 + b/2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.dpgm.models import RBM, VAE, Normal, Params
from dpcore.mechanisms.noise import NoiseSampler
from dpcore.mechanisms.secure_random import SecureRandom

# Sensitivities in noise units (module docstring), as the accountant's noise scales declare.
GRADIENT_SENSITIVITY = 2.0
HISTOGRAM_SENSITIVITY = math.sqrt(2.0)
# One record's contribution in the same units (its clipped gradient; its one-hot histogram
# entry): the Poisson-subsampled Gaussian's bound, which the sampler's cover is relative to.
GRADIENT_RADIUS = 1.0
HISTOGRAM_RADIUS = 1.0


@dataclass(frozen=True)
class SGDSettings:
    steps: int
    batch: int
    sigma: float  # σ_S: gradients, per unit of C
    sigma_norm: float  # σ_C: DPNorm's histogram
    clip_max: float
    bins: int
    lr: float


def histogram_bins(norms: torch.Tensor, clip_max: float, bins: int) -> torch.Tensor:
    """The bin of each norm: (C_{j−1}, C_j] → j − 1, C_j = j·C_max/w; 0 → bin 0; > C_max → last."""
    index = torch.ceil(norms * (bins / clip_max)).to(torch.int64) - 1
    return index.clamp(0, bins - 1)


def dpnorm(
    norms: torch.Tensor,
    *,
    clip_max: float,
    bins: int,
    sigma: float,
    sampler: NoiseSampler,
) -> float:
    """Alg. 3: the upper edge of the noisy mode of the norms' histogram (a public value)."""
    counts = torch.bincount(histogram_bins(norms, clip_max, bins), minlength=bins)
    # Counts are exact integers in float64: no rounding to cover.
    noisy = sampler(
        counts.double()[None, :],
        sigma=sigma,
        sensitivity=HISTOGRAM_SENSITIVITY,
        unit=HISTOGRAM_RADIUS,
    )
    # A float read-out: the mode is a released value, not a size the job's work depends on.
    mode = float(torch.argmax(noisy[0]).double())
    return (mode + 1.0) * clip_max / bins


def noisy_step(
    net: VAE | RBM,
    params: Params,
    X: torch.Tensor,
    assignment: torch.Tensor,
    rows: torch.Tensor,
    settings: SGDSettings,
    *,
    sampler: NoiseSampler,
    normal: Normal,
    error: float,
) -> tuple[torch.Tensor, float]:
    """One step's release: DPNorm's threshold C over the batch ``rows`` and the noisy sum of
    every network's clipped gradients in units of C, (M, P) float64 — networks in the order of
    ``params``' first axis, each block in ``net.names()`` order (module docstring)."""
    models = next(iter(params.values())).shape[0]
    names = net.names()
    # Records of no network (their class lost every cluster) train nothing: network 0 with
    # factor 0, norm 0 (bin 0). Every step does the same work whatever the assignment.
    own = assignment[rows]
    orphan = own < 0
    own = own.clamp_min(0)
    norms, clip_sum = net.gradients(params, X[rows], own, normal)
    norms = norms.masked_fill(orphan, 0.0)
    clip = dpnorm(
        norms,
        clip_max=settings.clip_max,
        bins=settings.bins,
        sigma=settings.sigma_norm,
        sampler=sampler,
    )
    factors = (clip / norms.clamp_min(1e-300)).clamp(max=1.0).masked_fill(orphan, 0.0)
    sums = clip_sum(factors)
    flat = torch.cat([sums[k].reshape(models, -1) for k in names], dim=1) / clip
    noisy = sampler(
        flat.reshape(1, -1),
        sigma=settings.sigma,
        sensitivity=GRADIENT_SENSITIVITY,
        error=error,
        unit=GRADIENT_RADIUS,
    )
    return noisy.reshape(models, -1).double(), clip


def per_record(normal: Normal, n: int, rows: torch.Tensor) -> Normal:
    """The public draws of the batch ``rows`` (shape (len(rows), …)) as those rows of one draw
    for all n records: the public stream advances by the same amount at every step whatever
    the secret batch size, and a record's draw does not depend on which others joined — so
    every public value is fixed independently of the Poisson bits, as the analysis assumes."""

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        if shape[0] != rows.shape[0]:
            raise ValueError(f"a per-record draw must have one row per batch record, got {shape}")
        full = normal((n, *shape[1:]))
        return full[rows.to(full.device)]

    return draw


def rounding_error(n: int) -> float:
    """The sampler's cover for the float64 sum of ≤ n clipped rows of norm ≤ 1 (units of C)."""
    return float_error.scaled_sum(GRADIENT_SENSITIVITY, terms=n, magnitude=float(n))


Progress = Callable[[int, int], None]

# torch.optim.Adam's defaults.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


class Descent:
    """Adam (``adam``: torch.optim.Adam's defaults and its fused kernel, update for update) or
    plain SGD on the noisy gradients, updating ``params`` in place. Post-processing of the
    released steps. The optimisers' own code is not used: torch.optim imports torch._dynamo
    when an optimiser is built (about 4 s in every fresh worker process). The fused kernel
    makes one pass over the parameters where the single-tensor arithmetic makes seven."""

    def __init__(self, params: Params, lr: float, *, adam: bool) -> None:
        self.params, self.lr, self.adam = params, lr, adam
        self.means = [torch.zeros_like(v) for v in params.values()]
        self.squares = [torch.zeros_like(v) for v in params.values()]
        # torch.optim's fused steps: one float32 count per parameter, on its device.
        self.steps = [
            torch.zeros((), dtype=torch.float32, device=v.device) for v in params.values()
        ]

    @torch.no_grad()
    def step(self, grads: Params) -> None:
        if not self.adam:
            for k, p in self.params.items():
                p.add_(grads[k], alpha=-self.lr)
            return
        torch._foreach_add_(self.steps, 1)
        torch._fused_adam_(
            list(self.params.values()),
            [grads[k] for k in self.params],
            self.means,
            self.squares,
            [],
            self.steps,
            amsgrad=False,
            lr=self.lr,
            beta1=ADAM_BETAS[0],
            beta2=ADAM_BETAS[1],
            weight_decay=0.0,
            eps=ADAM_EPS,
            maximize=False,
        )


def train(
    net: VAE | RBM,
    params: Params,
    X: torch.Tensor,
    assignment: torch.Tensor,
    sizes: torch.Tensor,
    settings: SGDSettings,
    *,
    sampler: NoiseSampler,
    generator: SecureRandom,
    normal: Normal,
    uniform: Callable[[tuple[int, ...]], torch.Tensor],
    progress: Progress | None = None,
) -> Params:
    """``params`` of M networks after ``settings.steps`` DP-SGD steps on the records ``X`` (n, d)
    in [0, 1], record i training network ``assignment[i]`` (module docstring); ``sizes`` (M,)
    the clusters' noisy sizes. ``normal`` and ``uniform`` draw the public randomness of the
    networks (reparametrisation, Gibbs chains): per step, fixed amounts (``per_record``, the
    chains' fixed shapes), never in proportion to the batch."""
    n, models = X.shape[0], next(iter(params.values())).shape[0]
    leaves = {k: v.clone() for k, v in params.items()}
    optimiser = Descent(leaves, settings.lr, adam=isinstance(net, VAE))
    names = net.names()
    widths = [math.prod(leaves[k].shape[1:]) for k in names]
    # The family's own cover: its norms and sums are computed differently (models.py).
    error = net.rounding_error(n, settings.clip_max / settings.bins, GRADIENT_SENSITIVITY)
    expected = (settings.batch / n * sizes.double()).clamp_min(1.0)
    if isinstance(net, RBM):
        net.state = (uniform((models, net.chains, net.d)) < 0.5).to(X.dtype)
    for index in range(settings.steps):
        chosen = generator.bernoulli(settings.batch, n, (n,))
        rows = torch.as_tensor(chosen.nonzero()[0], device=X.device)
        noisy, clip = noisy_step(
            net,
            leaves,
            X,
            assignment,
            rows,
            settings,
            sampler=sampler,
            normal=per_record(normal, n, rows),
            error=error,
        )
        step = noisy * (clip / expected[:, None])
        grads, offset = {}, 0
        for k, width in zip(names, widths, strict=True):
            chunk = step[:, offset : offset + width].reshape(leaves[k].shape)
            grads[k] = chunk.to(leaves[k].dtype)
            offset += width
        optimiser.step(grads)
        if isinstance(net, RBM):
            with torch.no_grad():
                for m in range(models):
                    net.advance(leaves, m, uniform)
        if progress is not None:
            progress(index + 1, settings.steps)
    return leaves
