"""MST's parameters: how numeric columns are cut, how long the model is fitted, how many rows
are drawn. None of them changes the privacy analysis (only the declared columns do)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The widest table MST takes: its selection scores every pair of attributes (k(k − 1)/2 pair
# histograms over the n records), which bounds a release's time and memory.
MAX_COLUMNS = 120
# The selection's pair histograms read every record once per pair: at most this many
# (pairs × n) record reads (tens of seconds), past which the tree structure is refused and the
# label structure (one pair per column) suggested.
MAX_PAIR_READS = 2_000_000_000


class MSTParams(BaseModel):
    """MST on the table's declared columns and its label."""

    model_config = ConfigDict(extra="forbid")

    n_samples: int | None = Field(
        default=None,
        ge=1,
        description="rows released, each drawn from the fitted model (post-processing)",
    )
    structure: Literal["tree", "label"] = Field(
        default="tree",
        description="which pairs are measured: tree — MST as published, a spanning tree of "
        "column pairs chosen by the exponential mechanism (a third of the budget); label — "
        "every column paired with the label, a public structure (a naive-Bayes model: no "
        "selection, the whole budget on the marginals; measured better for classifiers, "
        "docs/results/mst.md)",
    )
    bins: int = Field(
        default=16,
        ge=2,
        le=64,
        description="equal-width bins each numeric column's declared [lo, hi] is cut into (fewer "
        "keep more of a small table's shape out of the noise); a "
        "released value is drawn uniformly within its bin (public rule, no privacy cost)",
    )
    iterations: int = Field(
        default=1000,
        ge=1,
        le=20_000,
        description="mirror-descent steps fitting the graphical model to the noisy marginals "
        "(Private-PGM; post-processing: more steps cost time, not privacy)",
    )
