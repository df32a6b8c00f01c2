"""ClustMix — cluster-based mixing from "Approximate, Adapt, Anonymize (3A)" (Madl et al.).

Accounting only for now: ``dprelease account clustmix`` evaluates the paper's Eq. 8 and the
tight bound of the final noisy averaging (``accounting``); the service does not run it yet
(no release generator), so it is absent from ``GET /mechanisms`` and the request schema.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dpcore.accounting.accountant import Accountant, Key, lazy
from dpcore.mechanisms.spec import BenchCase, BenchHints, MechanismSpec

_MATH = f"{__name__}.accounting"


class ClustMixParams(BaseModel):
    """No release parameters yet: the mechanism is not served."""

    model_config = ConfigDict(extra="forbid")


_CLUSTER_SIZE = Key("cluster_size", int, "l: public lower bound on every cluster's size")

PAPER = Accountant(
    mechanism="clustmix",
    name="paper",
    summary="Madl et al. Eq. 8: μ = √(CD)/(lσ)-GDP for the final noisy averaging only, "
    "converted exactly; reproduction only",
    keys=(
        _CLUSTER_SIZE,
        Key("n_classes", int, "C: number of classes"),
        Key("n_features", int, "D: feature dimension"),
    ),
    build=lazy(_MATH, "paper"),
    guess=lazy(_MATH, "guess_paper"),
    valid_bound=False,
    caveat=(
        "Eq. 8 counts only the final noisy averaging; the GMM clustering, cluster sizes "
        "and KIP adaptation are data-dependent and unaccounted"
    ),
)

TIGHT = Accountant(
    mechanism="clustmix",
    name="tight",
    summary="final noisy averaging over a fixed clustering, records clipped to norm 1: "
    "Gaussian mechanism with L2 sensitivity max(2/l, 2√2/(l+1)) (GDP); clustering and "
    "KIP are not covered",
    keys=(
        _CLUSTER_SIZE,
        Key("n_classes", int, "C (used by the paper accountant only)", required=False),
        Key("n_features", int, "D (used by the paper accountant only)", required=False),
    ),
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess_tight"),
)

SPEC = MechanismSpec(
    name="clustmix",
    title="ClustMixRequest",
    summary="Cluster-based mixing (3A): noisy means of clusters of at least l records "
    "(accounting only; not served yet)",
    output="not served yet",
    params=ClustMixParams,
    accountants=(TIGHT, PAPER),
    bench=BenchHints(
        calibration=(
            BenchCase(
                "paper", 1.0, 1e-5, {"cluster_size": 118, "n_classes": 10, "n_features": 784}
            ),
        )
    ),
)
