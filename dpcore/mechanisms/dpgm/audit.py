"""DPGM's audit: ONE DP-SGD step through the real ``dpsgd.noisy_step`` (DPNorm's noisy
histogram and threshold C, per-record clipping, the noisy sum of every network's clipped
gradients in units of C), with the step's Poisson batch drawn as ``dpsgd.train`` draws it
(``SecureRandom.bernoulli(L, n)``), on neighbours where record 0's clipped gradient flips sign
— the largest replacement shift the accountant's bound allows.

Networks: a public stand-in family (``Probe``) whose per-record gradient is a fixed linear
function of the record, g(x) = C_max·(x_{1..4} − x_{5..8}) on the worker's [0, 1] features,
in a 4-parameter block per network. The accountant's bound holds for every gradient map (a
record's gradient depends on that record and public values only, ``models``), so a map that
reaches the bound is the network to audit; a VAE's gradients are not steerable to it.

Neighbours (replace-one, n public): record 0 is ones on the first half of the 8 features in
D, ones on the second half in D′, class 1 in both; the others are all-zero, class 0. One
network per class (K = 1: the assignment is the class, as the release does without k-means),
so record 0 trains network 1 in both and the others network 0. Record 0's gradient is
C_max·(1, 1, 1, 1) in D and −C_max·(1, 1, 1, 1) in D′ (norm 2·C_max); the others' is 0.

Why these neighbours: a record's clipped gradient has norm ≤ 1 in units of C, and the
accountant's proven pair (``dpcore.accounting.dpsgd``) is built from the replacement shift ≤ 2;
the antipodal, full-norm pair attains it (and is the pair dp_accounting's REPLACE_ONE compares,
(1−q)N(0, z²) + qN(−1, z²) against (1−q)N(0, z²) + qN(+1, z²); at q < 1 the proven claim lies
above it): here it is ±(½, ½, ½, ½), shift 2 along one direction, in network 1's block. A
record that changes class (network) moves two blocks by 1 each: √2, less. The gradient norm
2·C_max exceeds every threshold DPNorm can pick (C ≤ C_max), so whatever the noisy mode,
record 0 is clipped to exactly C and contributes
±(½, ½, ½, ½) in units of C: the release does not depend on C, and the audit uses the served
C_max and bins. The DPNorm histogram and its C are released too but carry no evidence here:
record 0's norm falls in the last bin in D and in D′, so their law is the same for both.

Released and scored: the noisy vector of all networks' blocks [network 0 | network 1] (8
coordinates, std σ_S per unit of C), one row per trial; the public ``projection`` maps
record 0's features onto its contribution (network 1's block, ±½ each). Row model: record 0
in the batch with probability q = L/n (``batch_size``, default n: q = 1, no subsampling),
coefficient 1 — the exact likelihood ratio, as the others contribute nothing.

Claim: the ``tight`` accountant for this one step: ``sgd_steps`` = 1, ``kmeans_iterations``
= 0 and σ_K = 1e9 (k-means and the final sizes, not run here, charged ~0), σ_C =
``norm_noise``·σ_S. The histogram cannot be exploited (above), so its share of the claim is
slack: the audit's default ``norm_noise`` 1000 makes it ~1e-6 of the step's μ² and the claim
the gradient's alone; ``norm_noise=4`` audits the served split. σ_C reaches the run as the
harness's second scale (``label_scale``; no labels block is released: classes are exact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpcore.audit.case import (
    HALF,
    N_FEATURES,
    AuditCase,
    Neighbours,
    fixed,
    records,
    unit_neighbours,
)
from dpcore.audit.runs import Release, Run, each
from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpgm.models import ClipSum, Normal, Params, secure_normal
from dpcore.mechanisms.dpgm.params import DPGMParams
from dpcore.mechanisms.noise import FastNoise
from dpcore.preprocessing import scale_to_unit

# One network per class: the others' (class 0) and record 0's (class 1).
MODELS = 2
# The served DPNorm settings (the audit's release does not depend on them: module docstring).
CLIP_MAX = float(DPGMParams.model_fields["clip_max"].default)
BINS = int(DPGMParams.model_fields["norm_bins"].default)
# σ_K of the claim: the k-means phase and the final sizes, not part of this step, charged ~0.
NEGLIGIBLE_KMEANS = 1e9


@dataclass(frozen=True)
class Probe:
    """A public stand-in network family: record x's gradient is ``scale``·(x_{1..4} − x_{5..8})
    in its network's one 4-coordinate parameter block (``models.Family``'s training half)."""

    # Record 0's ‖x_{1..4} − x_{5..8}‖ is 2: ‖g‖ = 2·C_max, above every threshold DPNorm picks.
    scale: float = CLIP_MAX

    def names(self) -> tuple[str, ...]:
        return ("w",)

    def init(self, models: int) -> Params:
        return {"w": torch.zeros((models, HALF), dtype=torch.float32)}

    def gradients(
        self, params: Params, x: torch.Tensor, a: torch.Tensor, normal: Normal
    ) -> tuple[torch.Tensor, ClipSum]:
        models = params["w"].shape[0]
        g = self.scale * (x[:, :HALF] - x[:, HALF:]).double()
        norms = torch.linalg.vector_norm(g, dim=1)

        def clip_sum(factors: torch.Tensor) -> Params:
            sums = torch.zeros((models, HALF), dtype=torch.float64, device=g.device)
            sums.index_add_(0, a, factors.double()[:, None] * g)
            return {"w": sums}

        return norms, clip_sum

    def rounding_error(self, n: int, clip_min: float, sensitivity: float) -> float:
        """The sums' cover alone: the audit measures the law of the step, not its rounding."""
        return dpsgd.rounding_error(n)


def batch_size(p: Mapping[str, Any]) -> int:
    n = records(p)
    size = p.get("batch_size")
    size = n if size is None else int(size)
    if not 1 <= size <= n:
        raise ValueError(f"batch_size must be in [1, n={n}], got {size}")
    return size


def neighbours(p: Mapping[str, Any]) -> Neighbours:
    """``unit_neighbours`` with record 0 in class 1 in both (the same network)."""
    nb = unit_neighbours(p)
    return dataclasses.replace(nb, labels_prime=nb.labels.copy(), n_classes=MODELS)


def preprocess(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    # The worker's: features to [0, 1] for the networks (``release``).
    return scale_to_unit(X, nb.lo, nb.hi)


def projection() -> torch.Tensor:
    """(M·4 × d): record 0's preprocessed features onto its clipped contribution, in units of
    C, in network 1's block: x_{1..4} − x_{5..8}, over its norm 2."""
    P = torch.zeros((MODELS * HALF, N_FEATURES), dtype=torch.float64)
    for i in range(HALF):
        P[HALF + i, i] = 0.5
        P[HALF + i, HALF + i] = -0.5
    return P


def settings(run: Run, p: Mapping[str, Any]) -> dpsgd.SGDSettings:
    """One step at the harness's scales: σ_S = σ_x (calibrated), σ_C = σ_y (``label_scale``)."""
    return dpsgd.SGDSettings(
        steps=1,
        batch=batch_size(p),
        sigma=run.sigma_x,
        sigma_norm=run.sigma_y,
        clip_max=CLIP_MAX,
        bins=BINS,
        lr=0.0,  # no descent: the audit stops at the step's release
    )


def run(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    sampler = run.noise if run.noise is not None else FastNoise(run.generator)
    n, step = records(p), settings(run, p)
    net = Probe()
    params = net.init(MODELS)
    # The networks' public randomness (the probe draws none), from the release's source.
    normal = secure_normal(run.generator, torch.device("cpu"))
    error = net.rounding_error(n, step.clip_max / step.bins, dpsgd.GRADIENT_SENSITIVITY)
    out = []
    for features, classes in each(run):
        # K = 1: every record trains its class's network (``release`` without k-means).
        assignment = classes.clone()
        rows = []
        for _ in range(run.trials):
            # The step's Poisson batch, drawn as ``dpsgd.train`` draws it.
            chosen = run.generator.bernoulli(step.batch, n, (n,))
            batch = torch.as_tensor(chosen.nonzero()[0])
            noisy, _ = fn(
                net,
                params,
                features,
                assignment,
                batch,
                step,
                sampler=sampler,
                normal=normal,
                error=error,
            )
            rows.append(noisy.reshape(-1))
        out.append(Release(torch.stack(rows)[:, None, :], None, projection()))
    return out[0], out[1]


def case() -> AuditCase:
    return AuditCase(
        neighbours=neighbours,
        preprocess=preprocess,
        function=lambda p: dpsgd.noisy_step,
        run=run,
        # Record 0 is in the batch with probability q = L/n, with coefficient 1.
        rows=lambda p: fixed(batch_size(p) / records(p), 1.0),
        claim_keys=lambda p: {
            "n": records(p),
            "batch_size": batch_size(p),
            "sgd_steps": 1,
            "kmeans_iterations": 0,
            "sigma_kmeans": NEGLIGIBLE_KMEANS,
            "norm_noise": p["norm_noise"],
        },
        exact_labels=True,
        label_scale="norm_histogram",
    )
