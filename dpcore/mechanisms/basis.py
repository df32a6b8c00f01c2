"""A public, data-independent feature basis for mixing mechanisms: spend the budget where the
signal is.

Rows are preprocessed as the mechanism's accountant assumes (norm ≤ R, and for unit-range
features every entry ≥ 0, so two rows are ≤ √2·R apart), then mapped to k coordinates by
z = Bᵀx with B a d × k matrix of orthonormal columns fixed before any data is read: the first
k functions of the orthonormal 2-D DCT-II of the declared image shape, lowest frequencies first
(1-D DCT for flat features). Mixing and noise then happen in k dimensions and the released rows
are x̂ = B·ẑ. Privacy: ‖Bᵀx − Bᵀx′‖ ≤ ‖x − x′‖ (an orthonormal projection is a contraction), so
every sensitivity the accountant states for the rows bounds the projected rows too, and mapping
back is post-processing. Utility: Gaussian noise of scale σ now has norm ≈ σ√k instead of σ√d,
at the price of what the k functions do not capture.

Floating point: B is computed in float64, so it is orthonormal only up to rounding; ``excess``
bounds how much further apart two neighbours' computed projections can be than the exact
bound (docs/privacy.md, "Public bases"); generators add it to the error their sampler covers.

Written by hand: scipy gives the DCT, the ordering and the bound are ours.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpcore.mechanisms import float_error
from dpcore.mechanisms.spec import InvalidParams, PublicFacts

Kind = Literal["auto", "identity", "dct"]

# The validator below, for clients and schema-driven tests (a mechanism whose parameters
# carry their own rules lists this one among them).
BASIS_RULE: dict[str, Any] = {
    "if": {"properties": {"basis": {"const": "identity"}}, "required": ["basis"]},
    "then": {"properties": {"basis_dim": {"type": "null"}}},
}


# Rows projected at a time: their float64 copy (6 MiB at d = 784) stays in cache between the
# conversion and the product (a whole-array copy makes the projection memory-bound).
PROJECT_CHUNK = 1024


class BasisParams(BaseModel):
    """The basis fields a mixing mechanism's parameters take (release-only: they change what
    is released, not what is charged)."""

    model_config = ConfigDict(json_schema_extra={"allOf": [BASIS_RULE]})

    basis: Kind = Field(
        default="auto",
        description="identity: mix and noise the d features as they are; dct: mix and noise "
        "the first basis_dim coefficients of the orthonormal DCT-II of each row (2-D over "
        "the declared image shape, lowest frequencies first), then map back — a public, "
        "data-independent projection: the charge is unchanged, the noise lives in basis_dim "
        "dimensions instead of d; auto: dct on image-shaped data (a declared 2-D "
        "feature_shape) with more than basis_dim features, identity otherwise",
    )
    basis_dim: int | None = Field(
        default=None,
        ge=1,
        description="k: coefficients the dct basis keeps (≤ d; default: the mechanism's, "
        "chosen by the MNIST sweet-spot study)",
    )

    @model_validator(mode="after")
    def _basis_dim(self) -> BasisParams:
        if self.basis == "identity" and self.basis_dim is not None:
            raise ValueError("basis_dim goes with basis 'dct' or 'auto'")
        return self


def check(params: BasisParams, facts: PublicFacts) -> None:
    """Admission: k fits the feature dimension."""
    if params.basis_dim is not None and params.basis_dim > facts.n_features:
        raise InvalidParams(
            f"basis_dim {params.basis_dim} exceeds the number of features {facts.n_features}"
        )


def _dct_rows(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: row u is the u-th basis function."""
    from scipy.fft import dct

    return np.asarray(dct(np.eye(n), norm="ortho", axis=0))


@functools.lru_cache(maxsize=8)
def dct_basis(shape: tuple[int, ...], k: int) -> np.ndarray:
    """d × k: the first k DCT-II functions of ``shape`` (2-D: ordered by u + v, then u — the
    zig-zag of JPEG; 1-D: by frequency), orthonormal columns, float64, read-only."""
    if len(shape) == 2:
        h, w = shape
        ch, cw = _dct_rows(h), _dct_rows(w)
        order = sorted(((u, v) for u in range(h) for v in range(w)), key=lambda t: (sum(t), t[0]))
        columns = [np.outer(ch[u], cw[v]).ravel() for u, v in order[:k]]
    else:
        d = math.prod(shape)
        columns = list(_dct_rows(d)[:k])
    basis = np.stack(columns, axis=1)
    basis.setflags(write=False)
    return basis


class Basis:
    """The basis of one release: ``project`` rows into it, ``lift`` noisy rows back."""

    def __init__(self, matrix: np.ndarray | None, description: str) -> None:
        self.matrix = matrix
        self.description = description

    @property
    def identity(self) -> bool:
        return self.matrix is None

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        """Bᵀx per row, computed in float64 (returned in float64), ``PROJECT_CHUNK`` rows at a
        time: memory n·k float64 for the result, never a float64 copy of all n·d inputs."""
        if self.matrix is None:
            return rows
        matrix = torch.tensor(self.matrix, device=rows.device)
        out = torch.empty((rows.shape[0], matrix.shape[1]), dtype=torch.float64, device=rows.device)
        for start in range(0, rows.shape[0], PROJECT_CHUNK):
            out[start : start + PROJECT_CHUNK] = (
                rows[start : start + PROJECT_CHUNK].double() @ matrix
            )
        return out

    def project_stored(self, rows: torch.Tensor) -> torch.Tensor:
        """``project``, the float64 result stored in float32: the table ``gather_sum`` sums
        fastest (float32 blocks; float64 tables take a slower kernel). ``stored_norm`` and
        ``stored_excess`` bound what the storage adds. No basis: the rows as they are."""
        if self.matrix is None:
            return rows
        return self.project(rows).float()

    @functools.cached_property
    def _projection_bounds(self) -> tuple[float, float]:
        """(η, √k·γ_d): a computed projection's norm is ≤ (1 + η)(1 + √k·γ_d)·‖x‖. Computed
        once per basis (the matrix never changes)."""
        assert self.matrix is not None
        d, k = self.matrix.shape
        g = float_error.gamma(d)
        gram = self.matrix.T @ self.matrix - np.eye(k)
        return float(np.linalg.norm(gram)) + 2 * k * k * g, math.sqrt(k) * g

    def stored_norm(self, magnitude: float) -> float:
        """A bound on the norm of ``project_stored``'s row for a row of norm ≤ ``magnitude``:
        ‖B̃ᵀx‖ ≤ (1 + η)‖x‖, its float64 rounding ≤ √k·γ_d·(1 + η)‖x‖ (``excess``), and the
        float32 storage moves each coordinate by ≤ 2⁻²⁴ relative."""
        if self.matrix is None:
            return magnitude
        eta, rounding = self._projection_bounds
        return magnitude * (1.0 + eta) * (1.0 + rounding) * (1.0 + 2.0**-24)

    def stored_excess(self, magnitude: float) -> float:
        """Extra distance between two neighbours' ``project_stored`` rows beyond the float64
        projections' (``excess``), for rows of norm ≤ ``magnitude``: storing a row moves it by
        ≤ 2⁻²⁴ times its float64 projection's norm, for each of the two."""
        if self.matrix is None:
            return 0.0
        eta, rounding = self._projection_bounds
        return 2.0 * 2.0**-24 * magnitude * (1.0 + eta) * (1.0 + rounding)

    def lift(self, coefficients: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """B·z per row: back to the d features (post-processing), computed in ``dtype`` when
        that is float32 (the rows' own precision; half the work of float64), else in float64."""
        if self.matrix is None:
            return coefficients.to(dtype)
        work = torch.float32 if dtype == torch.float32 else torch.float64
        matrix = torch.tensor(self.matrix, device=coefficients.device, dtype=work)
        return (coefficients.to(work) @ matrix.T).to(dtype)

    def excess(self, sensitivity: float, magnitude: float) -> float:
        """Extra distance between two neighbours' computed projections beyond ``sensitivity``
        (the exact bound on ‖x − x′‖, hence on ‖Bᵀx − Bᵀx′‖ for orthonormal B), for rows of
        norm ≤ ``magnitude``.

        The computed B̃ has ‖B̃‖₂ ≤ 1 + η with η = ‖B̃ᵀB̃ − I‖_F (its Gram deviation, itself
        evaluated in float64 and padded by 2k²·γ_d, the rounding of that evaluation); each
        projected coordinate carries rounding ≤ γ_d·Σ|B̃_ij||x_i| ≤ γ_d·(1 + η)·‖x‖, so a row's
        rounding is ≤ √k·γ_d·(1 + η)·magnitude, twice for a pair."""
        if self.matrix is None:
            return 0.0
        eta, rounding = self._projection_bounds
        return sensitivity * eta + 2.0 * rounding * (1.0 + eta) * magnitude


def _identity(params: BasisParams, image: bool, n_features: int, k: int) -> bool:
    return params.basis == "identity" or (params.basis == "auto" and not (image and n_features > k))


def dimension(params: BasisParams, facts: PublicFacts, default_dim: int) -> int:
    """The dimension of ``basis_for``'s basis (d for the identity), from the same facts."""
    n = facts.n_features
    k = params.basis_dim or default_dim
    image = len(facts.feature_shape) == 2 and math.prod(facts.feature_shape) == n
    return n if _identity(params, image, n, k) else min(k, n)


def projection_work(params: BasisParams, facts: PublicFacts, default_dim: int) -> float:
    """Multiply-adds of reading the records into ``basis_for``'s basis: n·d, times its
    dimension where it projects (public figures; ``Admission.work``)."""
    dim = dimension(params, facts, default_dim)
    return float(facts.n) * facts.n_features * (1 if dim == facts.n_features else dim)


def basis_for(
    params: BasisParams, feature_shape: tuple[int, ...], n_features: int, default_dim: int
) -> Basis:
    """The release's basis from public facts only (declared shape, k)."""
    k = params.basis_dim or default_dim
    image = len(feature_shape) == 2 and math.prod(feature_shape) == n_features
    if _identity(params, image, n_features, k):
        return Basis(None, "identity: the d features themselves")
    k = min(k, n_features)
    shape = tuple(feature_shape) if image else (n_features,)
    kind = "2-D" if image else "1-D"
    return Basis(
        dct_basis(shape, k),
        f"dct: rows projected on the first {k} functions of the orthonormal "
        f"{kind} DCT-II of shape {list(shape)} (lowest frequencies first), mixed and noised "
        "there, mapped back to the features (public, data-independent)",
    )


def unit_noise(
    params: BasisParams, facts: PublicFacts, default_dim: int, sigma: float
) -> np.ndarray:
    """The std of the noise on each released feature when N(0, σ²) is added to every basis
    coordinate and the rows are mapped back (x̂ = B·ẑ): σ·‖row p of B‖ for feature p (σ with
    no basis). Public: B is fixed by the declared shape and k."""
    basis = basis_for(params, tuple(facts.feature_shape), facts.n_features, default_dim)
    if basis.matrix is None:
        return np.full(facts.n_features, float(sigma))
    norms = np.sqrt(np.sum(np.square(basis.matrix), axis=1))
    return np.asarray(sigma * norms, dtype=np.float64)
