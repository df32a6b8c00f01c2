"""AIM's parameters: how numeric columns are cut, the rounds its budget is planned over, the
largest model it may grow, how long each fit runs, how many rows are drawn. Only ``rounds``
enters the privacy analysis (it sets the first measurements' scale); the declared columns
do too."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The widest table AIM takes: each round scores every pair of attributes against the model.
MAX_COLUMNS = 120
# Reading every candidate pair's histogram once: at most this many (pairs × n) record reads.
MAX_PAIR_READS = 2_000_000_000
# AIM's planned rounds per attribute (McKenna et al. 2022, Algorithm 2: T = 16d).
ROUNDS_PER_ATTRIBUTE = 16
MAX_ROUNDS = ROUNDS_PER_ATTRIBUTE * (MAX_COLUMNS + 1)


def default_max_rounds(attributes: int) -> int:
    return min(MAX_ROUNDS, 2 * attributes)


def default_rounds(attributes: int) -> int:
    """The paper's T, within the parameter's range (wider tables are refused at admission)."""
    return min(MAX_ROUNDS, ROUNDS_PER_ATTRIBUTE * attributes)


class AIMParams(BaseModel):
    """AIM on the table's declared columns and its label, workload: every pair of attributes."""

    model_config = ConfigDict(extra="forbid")

    n_samples: int | None = Field(
        default=None,
        ge=1,
        description="rows released, each drawn from the fitted model (post-processing)",
    )
    bins: int = Field(
        default=16,
        ge=2,
        le=64,
        description="equal-width bins each numeric column's declared [lo, hi] is cut into; a "
        "released value is drawn uniformly within its bin (public rule, no privacy cost)",
    )
    rounds: int | None = Field(
        default=None,
        ge=2,
        le=MAX_ROUNDS,
        description="T, the rounds AIM plans its budget over: each measurement starts at 1/T of "
        "it (nine tenths to the Gaussian, one tenth to the selection) and doubles its share "
        "each time the model stops improving, until the budget is spent; default 16 per "
        "attribute (the paper's)",
    )
    max_rounds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ROUNDS,
        description="most rounds the job runs (each fits the model anew: the job's time); a "
        "round takes at least an even share of the budget left over the rounds left, so the "
        "budget is spent within them; default twice the attributes",
    )
    max_model_size: float = Field(
        default=16.0,
        gt=0,
        le=256,
        description="largest graphical model (MiB of its junction tree's tables) AIM may grow; "
        "a round only considers marginals that keep the model within this share of it that the "
        "budget spent so far allows (bounds the job's time and memory)",
    )
    iterations: int = Field(
        default=1000,
        ge=1,
        le=20_000,
        description="mirror-descent steps of each fit of the graphical model to the noisy "
        "marginals (Private-PGM; post-processing: more steps cost time, not privacy)",
    )
