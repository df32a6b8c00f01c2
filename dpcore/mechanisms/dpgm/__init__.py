"""DPGM — DP kernel k-means and a mixture of generative networks trained with DP-SGD (Acs,
Melis, Castelluccia, De Cristofaro).

Accounting only for now: ``dprelease account dpgm`` evaluates the paper's Theorem 4 and the
tight PLD bound (``accounting``), whose events describe three noise scales (k-means,
DPNorm's histograms, gradients); the service does not run it yet (no release generator).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dpcore.accounting.accountant import Accountant, Key, N, lazy
from dpcore.mechanisms.spec import BenchCase, BenchHints, MechanismSpec

_MATH = f"{__name__}.accounting"
PAPER_LAMBDA_MAX = 32


class DPGMParams(BaseModel):
    """No release parameters yet: the mechanism is not served."""

    model_config = ConfigDict(extra="forbid")


_COMMON = (
    N,
    Key("batch_size", int, "L: expected batch size; Poisson sampling with q = L/n"),
    Key("sgd_steps", int, "T_S: number of DP-SGD steps"),
    Key("kmeans_iterations", int, "T_K: DP kernel k-means iterations", required=False, default=20),
    Key(
        "sigma_kmeans",
        float,
        "σ_K: noise std on cluster sizes, and per C_s on cluster feature sums (paper: √2·σ′_K)",
    ),
    Key("sigma_norm", float, "σ_C: noise std per DPNorm histogram bin (paper: √2·σ′_C)"),
    Key(
        "rbf",
        str,
        "true: RBF kernel, features clipped to the public C_s = 1, no DPNorm in k-means",
        required=False,
        default="true",
        choices=("true", "false"),
    ),
    Key("d_x", int, "feature dimension (not used by the DPGM accountants)", required=False),
    Key("d_y", int, "label dimension (not used by the DPGM accountants)", required=False),
    Key(
        "lambda_max",
        int,
        "largest integer moment order λ of Theorem 4 (paper accountant only)",
        required=False,
        default=PAPER_LAMBDA_MAX,
    ),
)

TIGHT = Accountant(
    mechanism="dpgm",
    name="tight",
    summary="k-means as exact GDP (μ = 2/σ_K per iteration), DP-SGD's norm histogram and "
    "gradient as one Poisson-subsampled Gaussian per step; PLD accountant, replace-one",
    keys=_COMMON,
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess_sigma"),
)

PAPER = Accountant(
    mechanism="dpgm",
    name="paper",
    summary="Acs et al. Theorem 4: Eq. 3 (Lemma 1) for k-means, Eq. 4 (Hölder weights, "
    "E1/E2 by numerical integration) for DP-SGD, integer λ ≤ lambda_max",
    keys=_COMMON,
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess_sigma"),
    valid_bound=False,
    caveat="Lemma 1 halves the Gaussian's moment, the k-means sum's replace-one "
    "sensitivity is 2·C_s (not √2·C_s) and E1/E2 are the add/remove pair: the paper's ε "
    "can be below the true replace-one ε",
)

SPEC = MechanismSpec(
    name="dpgm",
    title="DPGMRequest",
    summary="DP kernel k-means + a mixture of generative networks trained with DP-SGD "
    "(accounting only; not served yet)",
    output="not served yet",
    params=DPGMParams,
    accountants=(TIGHT, PAPER),
    bench=BenchHints(
        calibration=(
            BenchCase(
                "tight",
                2.0,
                1e-5,
                {
                    "n": 60_000,
                    "batch_size": 102,
                    "sgd_steps": 11_780,
                    "sigma_kmeans": 20.0,
                    "sigma_norm": 4.0,
                },
            ),
        )
    ),
)
