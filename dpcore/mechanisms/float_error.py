"""Bounds on floating-point rounding in the rows a sampler noises (docs/privacy.md, "Hardened
noise", "Rounding of the noised rows").

The accountants bound ‖f(D) − f(D′)‖ for the exact statistic f; the sampler is handed the
computed one. Two effects separate them, and both are covered by the ``error`` a generator
passes to its sampler (which raises its noise by the factor (Δ + error)/Δ):

1. Stored inputs. Preprocessing scales rows in float64 to L2 norm ≤ R (its own rounding is
   below (d + 2)·2⁻⁵³ relative) and stores them in float32, which moves each coordinate by at
   most 2⁻²⁴ relative. So the stored rows have norm ≤ R·(1 + ``INPUT_RELATIVE``) with
   ``INPUT_RELATIVE`` = 2⁻²³ (≥ 2⁻²⁴ + (d + 2)·2⁻⁵³ for any d < 2²⁸), keep their signs and
   their [0, 1] range; every sensitivity Δ, being linear in R, becomes Δ·(1 + 2⁻²³).
2. The computation. A sum of m terms evaluated in any order (any binary tree, or a chain of
   atomic adds) and scaled once has error ≤ γ_m·Σ|a_i| per coordinate, with γ_m = m·u/(1 −
   m·u) and u the unit roundoff (Higham, Accuracy and Stability of Numerical Algorithms,
   §3.1 and Lemma 3.1 on accumulated (1 + δ) factors); over coordinates, by the triangle
   inequality, ‖error‖₂ ≤ γ_m·Σ‖a_i‖₂. Each neighbour's row carries such an error, so the
   pair moves apart by at most 2·γ_m·Σ‖a_i‖₂ more. In float64 (u = 2⁻⁵³) this term is
   negligible (≈ 10⁻¹¹ relative at ℓ = 256). The mixing generators read float32 rows and sum
   them in float32 over blocks of at most b = 64 terms, then add the block sums in float64
   (``blocked_sum``): each term then carries a factor (1 + θ)(1 + η) with |θ| ≤ γ_b in
   float32 and |η| ≤ γ_{B+1} in float64 (B blocks, plus the scaling), so the relative bound
   is γ_b^{(32)} + γ_{B+1}^{(64)} + their product: ≈ 3.8·10⁻⁶ for every ℓ ≥ 64, ℓ·2⁻²⁴
   below.

Written by hand: no library bounds rounding for a given reduction.
"""

from __future__ import annotations

import torch

INPUT_RELATIVE = 2.0**-23

_UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}


def gamma(terms: int, dtype: torch.dtype = torch.float64) -> float:
    """γ_m = m·u/(1 − m·u): the relative error of m rounded operations in ``dtype``."""
    mu = terms * _UNIT_ROUNDOFF[dtype]
    if mu >= 0.5:
        raise ValueError(f"{terms} operations in {dtype} have no useful error bound")
    return mu / (1.0 - mu)


def stored_rows(sensitivity: float) -> float:
    """Extra distance between neighbours' rows released as stored (no computation)."""
    return sensitivity * INPUT_RELATIVE


def scaled_sum(
    sensitivity: float,
    *,
    terms: int,
    magnitude: float,
    dtype: torch.dtype = torch.float64,
) -> float:
    """Extra distance between neighbours' rows each computed as (Σ of ``terms`` vectors of
    total norm ≤ ``magnitude`` — the preprocessing's bound) times a scale, in ``dtype``.

    ``terms`` + 1 rounded operations per coordinate (the additions, the products or the final
    scaling), each row's own error ≤ γ·magnitude·(1 + 2⁻²³), twice for the pair, plus the
    stored inputs' excess."""
    own = gamma(terms + 1, dtype) * magnitude * (1.0 + INPUT_RELATIVE)
    return stored_rows(sensitivity) + 2.0 * own


def blocked_sum(
    sensitivity: float,
    *,
    terms: int,
    block: int,
    magnitude: float,
) -> float:
    """``scaled_sum`` for rows computed as float32 sums of blocks of at most ``block`` of the
    ``terms`` vectors, each block sum converted (exactly) to float64, the ⌈terms/block⌉ block
    sums added in float64 and the result scaled once in float64.

    Per coordinate a term a_i reaches the result as a_i·(1 + θ_i)(1 + η_i): |θ_i| ≤
    γ_{block−1} in float32 (its block's additions, any order), |η_i| ≤ γ_{B} in float64 (the
    B − 1 additions of block sums and the scaling); (1 + θ)(1 + η) − 1 is at most g =
    γ_block^{(32)} + γ_{B+1}^{(64)} + their product (each γ taken one step larger, as
    ``scaled_sum`` does). Each row's error is ≤ g·magnitude·(1 + 2⁻²³), twice for the pair,
    plus the stored inputs' excess."""
    if not 1 <= block <= terms:
        raise ValueError(f"need 1 <= block <= terms, got block={block}, terms={terms}")
    blocks = -(-terms // block)
    g32, g64 = gamma(block, torch.float32), gamma(blocks + 1, torch.float64)
    own = (g32 + g64 + g32 * g64) * magnitude * (1.0 + INPUT_RELATIVE)
    return stored_rows(sensitivity) + 2.0 * own
