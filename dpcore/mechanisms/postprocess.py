"""Free post-processing of a release: denoising from the release's own rows and
public facts, then projection back to the public feature domain.

Everything here reads the noisy released rows and public facts only (the noise scale σ, the
basis, the declared domain, the release's own labels), never the private data: by the
post-processing property of differential privacy (Dwork–Roth, Prop. 2.1, for (ε, δ)-DP; it
holds for every f-DP/PLD guarantee alike) the processed release has the charge of the raw one.
The raw release is kept for the dataset's owner.

Denoising (``denoise``) shrinks each row's deviation from its group's mean, direction by
direction in the group's principal axes, by a gain computed from the public noise level; per
group of rows (the classes, where a mechanism's labels are exact functions of public class indices;
all rows otherwise). Two gains, each for the case it was measured best in:

- ``wiener``: (λ_i − σ²)₊/λ_i, λ_i the group's sample variance along axis i — the linear
  minimum-mean-square estimate with the signal covariance estimated as Σ̂ − σ²I. Directions
  near the noise level keep a small gain, so a model that aggregates many rows still sees
  their weak signal (it helps ridge on DPMix's releases, docs/results/sweet_spot.md — though
  logistic regression, trees and CNNs lose much, which is why post-processing is opt-in).
- ``optimal``: A group's n centred rows (p coordinates) are signal plus independent
N(0, σ²) noise; with β = min(n, p)/max(n, p) and each singular value s_i of the centred group
normalised as y_i = s_i/(σ·√max(n, p)), Gavish & Donoho ("Optimal shrinkage of singular
values", IEEE Trans. Inf. Theory 2017, Frobenius loss) keep y_i only above the noise bulk's
edge 1 + √β and shrink it to √((y_i² − β − 1)² − 4β)/y_i: each row's component along the i-th
direction is multiplied by the gain √((y_i² − β − 1)² − 4β)/y_i². (For n ≫ p the gain tends to
the Wiener gain (λ_i − σ²)/λ_i; unlike that gain, directions inside the noise bulk — where a
finite sample's noise eigenvalues spread up to σ²(1 + √β)² — are dropped, not kept at a
spurious gain.) Used where the deviations are then scaled up (``spread``): that must not
amplify noise directions.

Both run in the basis coordinates (k dimensions when the mechanism mixed in a public basis),
where the noise is isotropic. A mechanism whose rows are means of ℓ records of
one group may ask for record-level ``spread``: the shrunk deviations from the group mean are
scaled by √ℓ, since a mean of ℓ records drawn without replacement varies ≈ ℓ times less than
a record (exactly (n_c − ℓ)/(ℓ(n_c − 1)) times; n_c is private, the public ℓ is used), so the
released rows have the spread of records, not of averages, along the directions kept.
Then features are clipped to the declared domain ([0, 1] for unit-range features)
and rows to the preprocessing's norm bound; noisy label vectors are projected onto the
probability simplex (the nearest class distribution, Euclidean).

Two passes, bounded memory: ``fit`` accumulates each group's first and second moments chunk
by chunk (k × k per group), ``transform`` maps chunks.
Written by hand: the few lines of shrinkage need no library (numpy's eigh does the work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field

from dpcore.mechanisms.basis import Basis, BasisParams

Postprocess = Literal["none", "denoise"]

# Parameters a mixing mechanism's generator reads and no accountant needs: the basis is a
# contraction (the sensitivity holds as stated) and post-processing is free.
RELEASE_ONLY = frozenset({"basis", "basis_dim", "postprocess"})

POSTPROCESS_HELP = (
    "Free post-processing of the release (same charge; the raw noisy release stays "
    "downloadable to the dataset's owner): none — the noisy rows as drawn; denoise — "
    "shrink each row towards its group's mean along the directions the public noise level "
    "does not dominate (Wiener filter from the release's own covariance), clip features to "
    "the public domain and rows to the norm bound, labels to class probabilities. Default "
    "none: on MNIST denoise helped ridge (DPMix) and scikit-learn's MLP (DP-CDA) but cost "
    "gradient-boosted trees, logistic regression and CNNs much (docs/results/sweet_spot.md)"
)


class ReleaseOnlyParams(BasisParams):
    """The release-only fields every mixing mechanism's parameters take (``RELEASE_ONLY``): the
    public basis and the free post-processing."""

    # Default none, by measurement (docs/results/sweet_spot.md: every model family with and
    # without denoise): the raw rows keep every family usable; denoise is the opt-in. SGDRM
    # too: its learner (bias-corrected SGD) expects the rows as drawn, and its denoise reshapes
    # features only (signed combinations: no domain clip, labels as drawn).
    postprocess: Postprocess = Field(default="none", description=POSTPROCESS_HELP)


def simplex(Y: np.ndarray) -> np.ndarray:
    """Each row's Euclidean projection onto the probability simplex (Duchi et al. 2008)."""
    k = Y.shape[1]
    ranked = -np.sort(-Y, axis=1)
    cumulative = np.cumsum(ranked, axis=1) - 1.0
    steps = np.arange(1, k + 1)
    support = ranked - cumulative / steps > 0
    rho = k - 1 - np.argmax(support[:, ::-1], axis=1)
    theta = cumulative[np.arange(len(Y)), rho] / (rho + 1)
    return np.clip(Y - theta[:, None], 0.0, None)  # type: ignore[no-any-return]


def shrinkage_gain(squares: np.ndarray, *, rows: int, dims: int, sigma: float) -> np.ndarray:
    """Per direction, the factor Gavish–Donoho's Frobenius-optimal shrinker applies to a
    centred group's component, from its squared singular values (the scatter matrix's
    eigenvalues) at known noise std ``sigma``."""
    if sigma <= 0:
        return np.ones_like(squares)
    big, small = max(rows, dims), min(rows, dims)
    beta = small / big
    y2 = np.clip(squares, 0.0, None) / (sigma**2 * big)
    above = y2 > (1.0 + np.sqrt(beta)) ** 2
    root = np.sqrt(np.clip((y2 - beta - 1.0) ** 2 - 4.0 * beta, 0.0, None))
    return np.where(above, root / np.maximum(y2, 1e-300), 0.0)  # type: ignore[no-any-return]


@dataclass
class _Moments:
    count: int = 0
    total: np.ndarray | None = None
    outer: np.ndarray | None = None

    def add(self, Z: np.ndarray) -> None:
        if self.total is None or self.outer is None:
            self.total = np.zeros(Z.shape[1])
            self.outer = np.zeros((Z.shape[1], Z.shape[1]))
        self.count += len(Z)
        self.total += Z.sum(axis=0)
        self.outer += Z.T @ Z


@dataclass
class Denoiser:
    """``fit`` every chunk, then ``transform`` every chunk (in any chunking).

    ``sigma``: the features' noise std per coordinate (public); ``grouped``: rows are grouped
    by their label's argmax (exact labels only); ``unit_box``: features live in [0, 1];
    ``max_norm``: the preprocessing's row norm bound; ``noisy_labels``: labels carry noise
    (projected onto the simplex); ``spread``: scale of the kept deviations (√ℓ for means of
    ℓ records of one group, 1 otherwise)."""

    sigma: float
    basis: Basis
    grouped: bool
    unit_box: bool
    max_norm: float
    noisy_labels: bool
    spread: float = 1.0
    shrinker: Literal["wiener", "optimal"] = "wiener"
    _moments: dict[int, _Moments] = field(default_factory=dict)
    _maps: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    description: str = POSTPROCESS_HELP

    def _coordinates(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return X if self.basis.matrix is None else X @ self.basis.matrix

    def _groups(self, Y: np.ndarray) -> np.ndarray:
        if not self.grouped:
            return np.zeros(len(Y), dtype=np.int64)
        return np.asarray(Y).argmax(axis=1)

    def fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        Z, groups = self._coordinates(X), self._groups(Y)
        for g in np.unique(groups):
            self._moments.setdefault(int(g), _Moments()).add(Z[groups == g])

    def _finish(self) -> None:
        for g, m in self._moments.items():
            assert m.total is not None and m.outer is not None
            mean = m.total / m.count
            if m.count < 2:
                self._maps[g] = (mean, np.zeros_like(m.outer))
                continue
            scatter = m.outer - m.count * np.outer(mean, mean)  # Σ (z − m)(z − m)ᵀ
            squares, vectors = np.linalg.eigh((scatter + scatter.T) / 2)
            if self.shrinker == "optimal":
                gain = shrinkage_gain(squares, rows=m.count, dims=len(mean), sigma=self.sigma)
            else:
                variances = squares / (m.count - 1)
                gain = np.clip(variances - self.sigma**2, 0.0, None) / np.maximum(variances, 1e-300)
            gain = self.spread * gain
            self._maps[g] = (mean, (vectors * gain) @ vectors.T)

    def transform(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self._maps:
            if not self._moments:
                raise ValueError("fit before transform")
            self._finish()
        Z, groups = self._coordinates(X), self._groups(Y)
        out = np.empty_like(Z)
        for g in np.unique(groups):
            rows = groups == g
            mean, gain = self._maps.get(int(g), (Z[rows].mean(axis=0), np.eye(Z.shape[1])))
            out[rows] = mean + (Z[rows] - mean) @ gain
        features = out if self.basis.matrix is None else out @ self.basis.matrix.T
        if self.unit_box:
            features = np.clip(features, 0.0, 1.0)
        norms = np.linalg.norm(features, axis=1, keepdims=True)
        features = features / np.maximum(norms / self.max_norm, 1.0)
        labels = simplex(np.asarray(Y, dtype=np.float64)) if self.noisy_labels else Y
        return features.astype(np.float32), np.asarray(labels, dtype=np.float32)


def postprocessor(
    choice: Postprocess,
    *,
    sigma: float,
    basis: Basis,
    grouped: bool,
    unit_box: bool,
    max_norm: float,
    noisy_labels: bool,
    spread: float = 1.0,
    shrinker: Literal["wiener", "optimal"] = "wiener",
) -> Denoiser | None:
    """The release's post-processing for the request's ``postprocess`` (None: rows as drawn)."""
    if choice == "none":
        return None
    return Denoiser(
        sigma=sigma,
        basis=basis,
        grouped=grouped,
        unit_box=unit_box,
        max_norm=max_norm,
        noisy_labels=noisy_labels,
        spread=spread,
        shrinker=shrinker,
    )
