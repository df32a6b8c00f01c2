"""MST — McKenna, Miklau, Sheldon, "Winning the NIST Contest: A scalable and general approach
to differentially private synthetic data", Journal of Privacy and Confidentiality 11(3), 2021:
noisy one-way marginals, a maximum spanning tree of pairs chosen by the exponential mechanism,
their noisy two-way marginals, a graphical model fitted to them (Private-PGM, the ``mbi``
library) and records drawn from it.

The whole mechanism: parameters (``params``), the accountant (``accounting``), the public
discretisation (``discretise``), the exact selection (``selection``), the model
(``model``) and the job (``release``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpcore.accounting.accountant import Accountant, Key, lazy
from dpcore.audit import keys as audit_keys
from dpcore.marginals.discretise import BINS_RULE, default_bins, widest_attribute
from dpcore.mechanisms.mst.params import (
    MAX_COLUMNS,
    MAX_PAIR_READS,
    MSTParams,
)
from dpcore.mechanisms.spec import (
    Accounting,
    Admission,
    AuditSpec,
    Execution,
    Guidance,
    InvalidParams,
    MechanismSpec,
    PublicFacts,
    ShapeDefault,
    rows_default,
)

if TYPE_CHECKING:
    from dpcore.accounting.events import NoiseDescription

_MATH = f"{__name__}.accounting"

TIGHT = Accountant(
    mechanism="mst",
    name="tight",
    summary="k one-way histograms (Gaussian, Δ₂ = √2 each), k − 1 exponential-mechanism "
    "selections (ε₀-bounded range: ε₀²/8-zCDP each), k − 1 two-way histograms (Gaussian); "
    "MST's even split, Rényi curves added, converted at δ (structure label: no selection, "
    "the two Gaussian steps' GDP μ converted exactly)",
    keys=(
        Key(
            "n_columns",
            int,
            "the table's declared columns (each categorical column once, each missing-value "
            "indicator once); k = n_columns + 1 with the label",
            minimum=1,
        ),
        Key.of(MSTParams, "structure"),
    ),
    build=lazy(_MATH, "tight"),
    guess=lazy(_MATH, "guess"),
)


def _noise_widths(params: MSTParams, facts: PublicFacts) -> dict[str, int]:
    """The widest draw of each noise: one attribute's histogram (numeric bins, a categorical
    block, the label, each with a missing-value level), and two such attributes' joint one."""
    size = widest_attribute(params.bins, facts.n_features, facts.n_classes)
    return {"one_way": size, "two_way": size * size}


def _check(params: MSTParams, facts: PublicFacts) -> None:
    columns = facts.keys()["n_columns"]
    if columns > MAX_COLUMNS:
        raise InvalidParams(
            f"MST is for tables: this dataset has {columns} columns, more than its limit of "
            f"{MAX_COLUMNS} (its selection scores every pair of columns); for images or other "
            "wide data use clustmix"
        )
    pairs = math.comb(columns + 1, 2)
    if params.structure == "tree" and pairs * facts.n > MAX_PAIR_READS:
        raise InvalidParams(
            f"MST's selection would score {pairs} pairs of columns over {facts.n} rows, more "
            f'than its limit of {MAX_PAIR_READS} record reads; structure "label" measures one '
            "pair per column and has no such limit"
        )
    facts.check_rows(params.n_samples if params.n_samples is not None else facts.n)


def _warnings(
    params: MSTParams, facts: PublicFacts, noise: NoiseDescription
) -> list[dict[str, str]]:
    sigma = noise.sigma("one_way")
    cells = facts.n / max(1, params.bins)
    if cells < 3 * sigma:
        return [
            {
                "code": "bins_lost_in_noise",
                "message": f"an even spread of the {facts.n} rows over {params.bins} bins puts "
                f"about {cells:.0f} in each, below 3 noise stds ({3 * sigma:.0f}): most bins of "
                "a numeric column will merge; fewer bins keep more of its shape",
            }
        ]
    return []


def _work(params: MSTParams, facts: PublicFacts) -> float:
    """Reading every column, scoring the candidate pairs (``_check`` bounds their reads),
    the fit's iterations over the measured marginals, and sampling every column per row."""
    columns = facts.keys()["n_columns"] + 1  # with the label
    size = widest_attribute(params.bins, facts.n_features, facts.n_classes)
    pairs = math.comb(columns, 2) if params.structure == "tree" else columns
    fit = float(params.iterations) * columns * size * size
    rows = params.n_samples if params.n_samples is not None else facts.n
    return float(facts.n) * (columns + pairs) + fit + float(rows) * columns * size


SPEC = MechanismSpec(
    name="mst",
    params=MSTParams,
    label_kind="exact",
    accounting=Accounting(
        accountants=(TIGHT,),
        release_only=frozenset({"n_samples", "bins", "iterations"}),
    ),
    guidance=Guidance(
        essentials=("structure", "bins", "n_samples"),
        summary="MST: a graphical model fitted to noisy one- and two-way marginals (a spanning "
        "tree of column pairs chosen privately), records sampled from it",
        output="X: n_samples × n_features records in the table's own domain (categories one "
        "per row, numbers within their declared bounds, drawn within public bins); y: each "
        "record's class",
        good_for="Tables with categorical columns and thousands of rows, the marginal-based "
        "line tabular users pick (NIST 2018 challenge); not images (refused past "
        f"{MAX_COLUMNS} columns)",
        reference='R. McKenna, G. Miklau, D. Sheldon, "Winning the NIST Contest: A scalable and '
        'general approach to differentially private synthetic data", Journal of Privacy and '
        "Confidentiality 11(3), 2021",
        warnings=_warnings,
    ),
    admission=Admission(
        title="MSTRequest",
        work=_work,
        shape_defaults=(
            rows_default(),
            ShapeDefault("bins", BINS_RULE, lambda values, facts: default_bins(facts.n)),
        ),
        check=_check,
        noise_widths=_noise_widths,
    ),
    execution=Execution(release=lazy(f"{__name__}.release", "release")),
    audit=AuditSpec(keys=(audit_keys.N,), case=lazy(f"{__name__}.audit", "case")),
)
