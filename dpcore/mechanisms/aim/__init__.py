"""AIM — McKenna, Mullins, Sheldon, Miklau, "AIM: An Adaptive and Iterative Mechanism for
Differentially Private Synthetic Data", VLDB 2022: noisy one-way marginals, then rounds that
select (by the exponential mechanism) the marginal the current graphical model fits worst,
measure it and refit the model (Private-PGM, the ``mbi`` library), with noise annealed as the
model stops improving, until a zCDP budget is spent; records drawn from the final model.

The whole mechanism: parameters (``params``), the accountant (``accounting``), candidates and
scores (``selection``) and the job (``release``); the discretisation, the exponential
mechanism and the model are shared with MST (``dpcore.marginals``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpcore.accounting.accountant import Accountant, Key, lazy
from dpcore.audit import keys as audit_keys
from dpcore.marginals.discretise import BINS_RULE, default_bins, widest_attribute
from dpcore.mechanisms.aim.params import (
    MAX_COLUMNS,
    MAX_PAIR_READS,
    AIMParams,
    default_max_rounds,
    default_rounds,
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
    mechanism="aim",
    name="tight",
    summary="a ρ-zCDP budget (ρ = T/(0.9σ₀²)) spent by noisy marginals (Gaussian, Δ₂ = √2 "
    "each) and exponential-mechanism selections (ε-bounded range: ε²/8-zCDP each) chosen "
    "adaptively and never past ρ (a Rényi filter), converted at δ",
    keys=(
        Key(
            "n_columns",
            int,
            "the table's declared columns (each categorical column once, each missing-value "
            "indicator once); k = n_columns + 1 with the label",
            minimum=1,
        ),
        Key("rounds", int, "T, the rounds the budget is planned over", minimum=2),
    ),
    build=lazy(_MATH, "zcdp"),
    guess=lazy(_MATH, "guess"),
)

ROUNDS_RULE = "16 per attribute: 16·(declared columns + 1), the paper's T"


def _check(params: AIMParams, facts: PublicFacts) -> None:
    columns = facts.keys()["n_columns"]
    if columns > MAX_COLUMNS:
        raise InvalidParams(
            f"AIM is for tables: this dataset has {columns} columns, more than its limit of "
            f"{MAX_COLUMNS} (each round scores every pair of columns); for images or other "
            "wide data use clustmix"
        )
    pairs = math.comb(columns + 1, 2)
    if pairs * facts.n > MAX_PAIR_READS:
        raise InvalidParams(
            f"AIM would read {pairs} pairs of columns over {facts.n} rows, more than its limit "
            f'of {MAX_PAIR_READS} record reads; mst with structure "label" has no such limit'
        )
    if params.rounds is not None and params.rounds < 2 * (columns + 1):
        raise InvalidParams(
            f"rounds must be at least twice the attributes ({2 * (columns + 1)} here: the "
            "declared columns and the label): the one-way marginals take 0.9/rounds of the "
            "budget each"
        )
    facts.check_rows(params.n_samples if params.n_samples is not None else facts.n)


def _noise_widths(params: AIMParams, facts: PublicFacts) -> dict[str, int]:
    """The widest draw of each noise: one attribute's histogram (numeric bins, a categorical
    block, the label, each with a missing-value level), and two such attributes' joint one."""
    size = widest_attribute(params.bins, facts.n_features, facts.n_classes)
    return {"one_way": size, "marginals": size * size}


def _work(params: AIMParams, facts: PublicFacts) -> float:
    """Reading every candidate's histogram once; each of at most ``max_rounds`` rounds scoring every
    candidate and fitting a model of at most ``max_model_size``; sampling every column per
    row."""
    columns = facts.keys()["n_columns"] + 1  # with the label
    size = widest_attribute(params.bins, facts.n_features, facts.n_classes)
    pairs = math.comb(columns, 2)
    rounds = params.max_rounds if params.max_rounds is not None else default_max_rounds(columns)
    cells = params.max_model_size * 2**20 / 8
    per_round = pairs * size * size + float(params.iterations) * cells
    rows = params.n_samples if params.n_samples is not None else facts.n
    return float(facts.n) * (columns + pairs) + rounds * per_round + float(rows) * columns * size


def _warnings(
    params: AIMParams, facts: PublicFacts, noise: NoiseDescription
) -> list[dict[str, str]]:
    sigma = noise.sigma("one_way")
    cells = facts.n / max(1, params.bins)
    if cells < 3 * sigma:
        return [
            {
                "code": "bins_lost_in_noise",
                "message": f"AIM's first measurements add noise of std {sigma:.0f} to each "
                f"count, more than a third of an even bin's {cells:.0f} rows: it will spend "
                "rounds halving the noise before the model learns much; at this n and ε "
                "mst (structure label) usually keeps more",
            }
        ]
    return []


SPEC = MechanismSpec(
    name="aim",
    params=AIMParams,
    label_kind="exact",
    accounting=Accounting(
        accountants=(TIGHT,),
        release_only=frozenset({"n_samples", "bins", "iterations", "max_model_size", "max_rounds"}),
    ),
    guidance=Guidance(
        essentials=("bins", "n_samples"),
        summary="AIM: a graphical model grown round by round from the noisy marginals it "
        "fits worst (chosen privately), records sampled from it",
        output="X: n_samples × n_features records in the table's own domain (categories one "
        "per row, numbers within their declared bounds, drawn within public bins); y: each "
        "record's class",
        good_for="Tables with thousands of rows or more and categorical columns: the "
        "marginal-based line's adaptive member, which measures the pairs that matter; not "
        f"images (refused past {MAX_COLUMNS} columns); slower than mst (a model fit each round)",
        reference='R. McKenna, B. Mullins, D. Sheldon, G. Miklau, "AIM: An Adaptive and '
        'Iterative Mechanism for Differentially Private Synthetic Data", PVLDB 15(11), 2022',
        warnings=_warnings,
    ),
    admission=Admission(
        title="AIMRequest",
        work=_work,
        shape_defaults=(
            rows_default(),
            ShapeDefault("bins", BINS_RULE, lambda values, facts: default_bins(facts.n)),
            ShapeDefault(
                "rounds",
                ROUNDS_RULE,
                lambda values, facts: default_rounds(facts.keys()["n_columns"] + 1),
            ),
            ShapeDefault(
                "max_rounds",
                "twice the attributes: 2·(declared columns + 1)",
                lambda values, facts: default_max_rounds(facts.keys()["n_columns"] + 1),
            ),
        ),
        check=_check,
        noise_widths=_noise_widths,
    ),
    execution=Execution(release=lazy(f"{__name__}.release", "release")),
    audit=AuditSpec(keys=(audit_keys.N,), case=lazy(f"{__name__}.audit", "case")),
)
