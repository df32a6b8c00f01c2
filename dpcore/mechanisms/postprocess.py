"""Free post-processing of a release (issue 11): denoising from the release's own rows and
public facts, then projection back to the public feature domain.

Everything here reads the noisy released rows and public facts only (the noise scale σ, the
basis, the declared domain, the release's own labels), never the private data: by the
post-processing property of differential privacy (Dwork–Roth, Prop. 2.1, for (ε, δ)-DP; it
holds for every f-DP/PLD guarantee alike) the processed release has the charge of the raw one.
The raw release is kept for the dataset's owner.

Denoising (``denoise``) is linear shrinkage with a known noise level, per group of rows (the
classes, where a mechanism's labels are exact functions of public class indices; all rows
otherwise). A group's rows are z = s + e with e ~ N(0, σ²I) independent of the signal s; the
group's sample covariance Σ̂ estimates Cov(s) + σ²I, so in its eigenbasis (λ_i, v_i) the
signal's variance along v_i is estimated by (λ_i − σ²)₊ and the linear minimum-mean-square
estimate of s is m + Σ_i g_i·⟨z − m, v_i⟩·v_i with g_i = (λ_i − σ²)₊ / λ_i (the Wiener filter
with an empirical signal covariance; directions the noise dominates are dropped, the others
shrunk — a soft version of keeping the top eigenvectors above the noise floor). It runs in the
basis coordinates (k dimensions when the mechanism mixed in a public basis) where the noise is
isotropic. Then features are clipped to the declared domain ([0, 1] for unit-range features)
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

from dpcore.mechanisms.basis import Basis

Postprocess = Literal["none", "denoise"]

# Parameters a mixing mechanism's generator reads and no accountant needs: the basis is a
# contraction (the sensitivity holds as stated) and post-processing is free.
RELEASE_ONLY = frozenset({"basis", "basis_dim", "postprocess"})

POSTPROCESS_HELP = (
    "Free post-processing of the release (same charge; the raw noisy release stays "
    "downloadable to the dataset's owner): none — the noisy rows as drawn; denoise — "
    "shrink each row towards its group's mean along the directions the public noise level "
    "does not dominate (Wiener filter from the release's own covariance), clip features to "
    "the public domain and rows to the norm bound, labels to class probabilities"
)


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
    (projected onto the simplex)."""

    sigma: float
    basis: Basis
    grouped: bool
    unit_box: bool
    max_norm: float
    noisy_labels: bool
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
        noise = self.sigma**2
        for g, m in self._moments.items():
            assert m.total is not None and m.outer is not None
            mean = m.total / m.count
            if m.count < 2:
                self._maps[g] = (mean, np.zeros_like(m.outer))
                continue
            cov = (m.outer - m.count * np.outer(mean, mean)) / (m.count - 1)
            values, vectors = np.linalg.eigh((cov + cov.T) / 2)
            gain = np.clip(values - noise, 0.0, None) / np.maximum(values, 1e-300)
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
    )
