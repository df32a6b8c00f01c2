"""Sharded releases: one release's rows drawn as several independent parts.

A mechanism can be sharded when its release is a sequence of rows drawn independently and
identically given the data — every mixture of DPMix's mixture assignment picks its own uniform
subset; DP-CDA draws each class's mixtures alike, one block of ``n_classes`` rows per unit;
every SGDRM combination includes each record on its own coins — and when its generator draws
nothing before the rows (no noisy statistics, no noisy class sizes: those would be drawn once
per shard). Then drawing T rows equals drawing T₁, …, T_m rows (Σ T_j = T) with independent
randomness and concatenating them: the same law, so the same accountant and the same charge.

A mechanism declares it with ``Execution.shard`` (a ``ShardSpec``): which parameter counts
the rows, how many rows make one indivisible unit, and which parameter values forbid it. The
plan is a function of public facts (the parameters and the service's settings) only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class ShardSpec:
    """How a mechanism's release splits.

    ``rows_param``: the parameter holding the number of rows asked for. ``unit(params,
    n_classes)``: the rows of one indivisible unit (1 for DPMix; DP-CDA draws its rows class by
    class, ``n_classes`` rows per unit, so a shard asking ``u·n_classes`` rows makes exactly u
    per class). ``refuse(params)``: why these parameter values cannot be sharded (a draw made
    before the rows, or rows that are not independent), or None."""

    rows_param: str
    unit: Callable[[Any, int], int] = lambda params, n_classes: 1
    refuse: Callable[[Any], str | None] = lambda params: None
    # What GET /mechanisms says of it, e.g. "by n_samples, except with assignment record".
    exceptions: str = ""

    @property
    def summary(self) -> str:
        rows = f"by {self.rows_param}"
        return f"{rows}, except {self.exceptions}" if self.exceptions else rows


@dataclass(frozen=True)
class ShardPlan:
    """A release split into ``len(units)`` shards, shard j drawing ``units[j]`` units of
    ``unit`` rows. Its ``key`` names the split (the parts of two different splits never mix)."""

    rows_param: str
    unit: int
    units: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.units)

    @property
    def rows(self) -> int:
        return self.unit * sum(self.units)

    @property
    def key(self) -> str:
        return f"{self.count}x{self.unit}-{sum(self.units)}"

    def rows_of(self, index: int) -> int:
        return self.unit * self.units[index]

    def params_of(self, params: BaseModel, index: int) -> dict[str, Any]:
        """Shard ``index``'s parameters: the release's, with the rows parameter set to its
        share (every other value, the noise's included, is the release's own)."""
        return {**params.model_dump(), self.rows_param: self.rows_of(index)}


def plan(
    spec: ShardSpec | None,
    params: BaseModel,
    *,
    n_classes: int,
    shard_rows: int,
    max_shards: int,
) -> ShardPlan | None:
    """The split of a release (validated ``params``), or None when it runs whole: the
    mechanism cannot be sharded, these parameters forbid it, sharding is off (``shard_rows``
    0) or the release fits in one shard. The release makes ⌈requested/unit⌉ units (what the
    unsharded generator makes: DP-CDA's ⌈T/k⌉ rows per class); m = min(max_shards,
    ⌈rows/shard_rows⌉, units) shards get ⌈units/m⌉ or ⌊units/m⌋ units each."""
    if spec is None or shard_rows <= 0 or spec.refuse(params) is not None:
        return None
    unit = int(spec.unit(params, n_classes))
    if unit < 1:
        raise ValueError(f"a shard unit of {unit} rows")
    total = -(-int(getattr(params, spec.rows_param)) // unit)
    rows = unit * total
    count = min(max_shards, -(-rows // shard_rows), total)
    if count < 2:
        return None
    return split(spec.rows_param, unit, total, count)


def split(rows_param: str, unit: int, total: int, count: int) -> ShardPlan:
    """``total`` units over ``count`` shards, the first ``total mod count`` one unit larger."""
    base, extra = divmod(total, count)
    return ShardPlan(rows_param, unit, tuple(base + (j < extra) for j in range(count)))


def from_key(rows_param: str, key: str) -> ShardPlan:
    """The plan ``ShardPlan.key`` names (a shard task is handed the key, so every worker
    draws the same split whatever its own settings)."""
    try:
        head, total = key.split("-")
        count, unit = head.split("x")
        made = split(rows_param, int(unit), int(total), int(count))
    except ValueError as exc:
        raise ValueError(f"not a shard plan key: {key!r}") from exc
    if made.key != key or made.unit < 1 or min(made.units) < 1:
        raise ValueError(f"not a shard plan key: {key!r}")
    return made


class DrawRefused(RuntimeError):
    """A generator drew randomness where a sharded release allows none."""


def _sealed_source() -> Any:
    from dpcore.mechanisms.secure_random import SecureRandom

    class SealedRandom(SecureRandom):
        """A source that refuses every draw (every draw goes through ``fill``)."""

        def fill(self, out: Any) -> Any:
            raise DrawRefused(
                "the generator drew randomness before its rows: this release cannot be sharded"
            )

    return SealedRandom(key=bytes(32))


@dataclass(frozen=True)
class RefusingNoise:
    """A noise sampler that refuses every draw."""

    name: str = "refusing"

    def __call__(
        self,
        values: Any,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> Any:
        raise DrawRefused(
            "the generator drew noise before its rows: this release cannot be sharded"
        )


def sealed() -> tuple[Any, RefusingNoise]:
    """Randomness for building a sharded release's output description (metadata, transform,
    post-processing) without drawing: its rows come from the shards. Every draw raises
    ``DrawRefused``, which is how a spec that wrongly declares a shardable configuration is
    caught before anything is published."""
    return _sealed_source(), RefusingNoise()
