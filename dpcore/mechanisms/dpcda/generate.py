"""DP-CDA class-centric mixing: per class, noisy means of ℓ distinct records of that class.

Records arrive standardised with public statistics and clipped to L2 norm ≤ C (what the
accountant's sensitivity assumes: √2·C/ℓ when every feature is ≥ 0, else 2C/ℓ). Output is
class-balanced: T_c = ⌈T/K⌉ mixtures per class, each the mean of ℓ records drawn uniformly
without replacement from its class, independently per mixture, plus N(0, σ²I). A mixture's
label is its class (exact): it depends on the public class index only.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from dpcore.mechanisms import float_error
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.class_mixing import class_chunks, class_order, mixture_sensitivity
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.sampling import floyd_indices, gather_sum, gather_sum_error
from dpcore.mechanisms.secure_random import SecureRandom


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    n_classes: int,
    mixture_degree: int,
    n_samples: int,
    sigma: float,
    clip_norm: float,
    nonnegative: bool,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    basis: Basis | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``labels`` are class indices (n,); yields (X', one-hot Y) chunks, class by class.
    With a ``basis`` (``dpcore.mechanisms.basis``) the rows are projected after the premise
    checks, mixed and noised in its k coordinates, and mapped back.

    Rows of ``features`` must have L2 norm ≤ ``clip_norm`` (and, with ``nonnegative``, no
    negative entry): a mixture mean then moves by at most √2·C/ℓ (non-negative) or 2C/ℓ when
    one member is replaced (the accountant's sensitivity)."""
    sampler = noise if noise is not None else FastNoise(generator)
    sensitivity = mixture_sensitivity(
        clip_norm=clip_norm, mixture_degree=mixture_degree, nonnegative=nonnegative
    )
    if labels.ndim != 1 or labels.shape[0] != features.shape[0]:
        raise ValueError("labels must be class indices, one per record")
    # The premise of √2·C/ℓ, checked rather than trusted (the preprocessing guarantees it;
    # a failure here means a bug, and stops the release before any noise is drawn).
    if nonnegative and bool((features < 0).any()):
        raise ValueError("non-negative features were promised, a negative one was found")
    device, dtype = features.device, features.dtype
    excess, magnitude = 0.0, clip_norm
    if basis is not None:
        # A contraction: the sensitivity above bounds the projected rows too (plus the
        # projection's rounding and its float32 storage, ``Basis.project_stored``).
        stored = clip_norm * (1.0 + float_error.INPUT_RELATIVE)
        excess = basis.excess(sensitivity, stored) + basis.stored_excess(stored)
        magnitude = basis.stored_norm(clip_norm)
        features = basis.project_stored(features)
    # Means are sums of ℓ rows (``gather_sum``: float32 blocks added in float64, or float64)
    # scaled by 1/ℓ; the sampler covers their rounding and the stored rows'.
    error = excess + gather_sum_error(
        sensitivity, terms=mixture_degree, magnitude=magnitude, dtype=features.dtype
    )
    # Work, chunks and the randomness drawn depend on public sizes only (n, K, T_c, ℓ, d),
    # never on a class's size: the class sizes and member offsets stay in numpy (one stable
    # sort of all labels), chunks are sized by n, Floyd's sampler makes ℓ draws per mixture
    # whatever the class size, and every torch operation is sized by n, the chunk and ℓ.
    # Run time and progress then tell nothing of the private class counts.
    order, counts, starts = class_order(labels.cpu().numpy(), n_classes)
    chunks = class_chunks(
        n=labels.shape[0],
        n_classes=n_classes,
        mixture_degree=mixture_degree,
        n_samples=n_samples,
        dim=features.shape[1],
    )
    for c, count in chunks:
        # Checked before the class's first draw.
        if counts[c] < mixture_degree:
            raise ValueError(f"class {c} has fewer records than mixture_degree={mixture_degree}")
        # Each mixture's members in rank order (dataset order within the class): a set of
        # members is then summed in the same order on neighbours whose ranks shift (a record
        # moved between classes), so a mixture without that record keeps its bits, as the
        # secure sampler's cover assumes. The set, and so the law, is unchanged.
        local = np.sort(
            floyd_indices(int(counts[c]), mixture_degree, count, generator=generator), axis=1
        )
        chosen = torch.from_numpy(order[starts[c] + local]).to(device)
        mixed = gather_sum(features, chosen) / mixture_degree
        onehot = torch.zeros((count, n_classes), device=device, dtype=dtype)
        onehot[:, c] = 1
        noisy = sampler(mixed, sigma=sigma, sensitivity=sensitivity, error=error)
        yield (basis.lift(noisy, dtype) if basis is not None else noisy.to(dtype)), onehot
