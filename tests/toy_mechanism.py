"""A mechanism defined entirely inside the test suite: one spec, no edit anywhere else.

``toy_average`` releases T noisy means of all n (unit-scale) records, after a first step that
releases the noisy feature totals: two data-dependent steps composed into one ledger entry,
with three noise scales (totals, features, labels) — the shape of a multi-phase mechanism.

Privacy (replace-one, n public): the totals move by at most √2 (unit-scale records), a mean of
all records by √2/n in features and in labels; every step is a Gaussian mechanism, so the
whole is μ-GDP with μ² = 2/σ_t² + T·(2/(n²σ²) + 2/(n²σ_y²)).

``GATE`` is a test seam: the generator waits on it before every chunk (open by default), so a
test can hold a release running. ``with_weights`` adds a further file (``weights.json``, the
noisy totals again) as a model's weights would be. With ``own_progress`` the generator reports
its progress itself (phase "means", through ``RunContext.report``) just before each wait.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from dpcore.accounting.accountant import NOISE_RATIO, SIGMA_Y, Accountant, Key, N, sigma_y_of
from dpcore.accounting.composition import GaussianEvent
from dpcore.accounting.events import ComposedEvent, GaussianQuery, NoiseDescription, NoiseScale
from dpcore.audit import keys as audit_keys
from dpcore.audit.case import AuditCase, fixed, unit_neighbours, unit_preprocess
from dpcore.audit.runs import Release, Run, collect, each
from dpcore.mechanisms.basis import Basis
from dpcore.mechanisms.contract import ExtraArtifact, PrivateData, ReleaseOutput, RunContext
from dpcore.mechanisms.inputs import unit_scale, unit_transform
from dpcore.mechanisms.noise import FastNoise, NoiseSampler
from dpcore.mechanisms.postprocess import Postprocess, postprocessor
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import (
    Accounting,
    Admission,
    AuditSpec,
    Execution,
    Guidance,
    InvalidParams,
    MechanismSpec,
    PublicFacts,
)

NAME = "toy_average"
SQRT2 = math.sqrt(2.0)
CHUNK = 16
GATE = threading.Event()
GATE.set()
GATE_TIMEOUT_S = 60.0
OWN_PHASE = "means"
WEIGHTS = "weights.json"


class ToyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1, description="T: noisy means released")
    totals_noise: float = Field(
        default=1.0, gt=0, description="σ_t: noise std on the released feature totals"
    )
    with_weights: bool = Field(
        default=False,
        description="Also release the noisy totals as a further file, weights.json",
    )
    postprocess: Postprocess = Field(
        default="none", description="denoise: the shared free post-processing (raw kept)"
    )
    own_progress: bool = Field(
        default=False,
        description="Report progress in the generator's own units (phase 'means') instead of "
        "letting the worker count rows",
    )


@dataclass(frozen=True)
class MeansEvent(GaussianEvent):
    n: int
    rows: int
    sigma_x: float
    sigma_y: float

    @property
    def mu(self) -> float:
        per_row = (SQRT2 / self.n) ** 2 * (1 / self.sigma_x**2 + 1 / self.sigma_y**2)
        return math.sqrt(self.rows * per_row)

    def noise(self) -> NoiseDescription:
        return NoiseDescription(
            scales=(
                NoiseScale("features", self.sigma_x, SQRT2 / self.n, ("features",)),
                NoiseScale("labels", self.sigma_y, SQRT2 / self.n, ("labels",)),
            ),
            calibrated="features",
        )

    def describe(self) -> dict[str, Any]:
        return {"mechanism": NAME, "step": "means", "mu": self.mu}


def totals_step(sigma: float) -> GaussianQuery:
    return GaussianQuery(NoiseScale("totals", sigma, SQRT2, ("feature totals",)))


def build(sigma: float, keys: Mapping[str, Any]) -> ComposedEvent:
    means = MeansEvent(keys["n"], keys["rows"], sigma, sigma_y_of(sigma, keys))
    return ComposedEvent((totals_step(keys["totals_noise"]), means), calibrated="features")


def generate(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    rows: int,
    sigma_x: float,
    sigma_y: float,
    generator: SecureRandom,
    noise: NoiseSampler | None = None,
    before_chunk: Callable[[int], None] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``rows`` copies of the mean of every record, each with fresh noise."""
    sampler = noise if noise is not None else FastNoise(generator)
    n = features.shape[0]
    mean_x, mean_y = features.mean(dim=0), labels.mean(dim=0)
    for start in range(0, rows, CHUNK):
        if before_chunk is not None:
            before_chunk(start)
        count = min(CHUNK, rows - start)
        yield (
            sampler(mean_x.expand(count, -1).clone(), sigma=sigma_x, sensitivity=SQRT2 / n),
            sampler(mean_y.expand(count, -1).clone(), sigma=sigma_y, sensitivity=SQRT2 / n),
        )


def release(params: ToyParams, data: PrivateData, ctx: RunContext) -> ReleaseOutput:
    features, labels = unit_scale(data, ctx.device, unit_transform(data, 1.0))
    totals = ctx.sampler(
        features.sum(dim=0, keepdim=True), sigma=params.totals_noise, sensitivity=SQRT2
    )

    def wait(start: int) -> None:
        if params.own_progress:
            ctx.report(start, params.rows, OWN_PHASE)  # raises Cancelled once cancelled
        if not GATE.wait(GATE_TIMEOUT_S):
            raise TimeoutError("the toy mechanism's gate stayed closed")

    return ReleaseOutput(
        rows=params.rows,
        feature_names=list(data.feature_names),
        chunks=generate(
            features,
            labels,
            rows=params.rows,
            sigma_x=ctx.sigma("features"),
            sigma_y=ctx.sigma("labels"),
            generator=ctx.generator,
            noise=ctx.sampler,
            before_chunk=wait,
        ),
        extra={"totals": totals.cpu().numpy()},
        artifacts=(weights(totals),) if params.with_weights else (),
        progress="own" if params.own_progress else "rows",
        postprocess=postprocessor(
            params.postprocess,
            sigma=ctx.sigma("features"),
            basis=Basis(None, "identity"),
            grouped=False,
            unit_box=True,
            max_norm=1.0,
            noisy_labels=True,
        ),
    )


def weights(totals: torch.Tensor) -> ExtraArtifact:
    """A further file, as a trained model's weights would be: the noisy totals (the same draw
    as the NPZ's ``totals``), as JSON."""

    def write(path: Path) -> None:
        path.write_text(json.dumps({"totals": totals.cpu().tolist()}))

    return ExtraArtifact(
        name=WEIGHTS,
        media_type="application/json",
        description="the noisy feature totals (test only)",
        write=write,
    )


def check(params: ToyParams, facts: PublicFacts) -> None:
    if params.rows > 10_000:
        raise InvalidParams(f"rows {params.rows} is more than a toy releases")
    facts.check_rows(params.rows)


def work(params: ToyParams, facts: PublicFacts) -> float:
    """Declared work: each released mean sums all n records' features."""
    return float(params.rows * facts.n * max(facts.n_features, 1))


def run_audit(fn: Callable[..., Any], run: Run, p: Mapping[str, Any]) -> tuple[Release, Release]:
    out = []
    for features, labels in each(run):
        chunks = fn(
            features,
            labels,
            rows=p["rows"] * run.trials,
            sigma_x=run.sigma_x,
            sigma_y=run.sigma_y,
            generator=run.generator,
            noise=run.noise,
        )
        out.append(Release(*collect(chunks, run.trials)))
    return out[0], out[1]


def audit_case() -> AuditCase:
    return AuditCase(
        neighbours=unit_neighbours,
        preprocess=unit_preprocess,
        function=lambda p: generate,
        run=run_audit,
        # Every row holds every record, with coefficient 1/n (the others are zero records).
        rows=lambda p: fixed(1.0, 1 / p["n"]),
        claim_keys=lambda p: {
            "n": p["n"],
            "rows": p["rows"],
            "totals_noise": p["totals_noise"],
            "noise_ratio": p["noise_ratio"],
        },
    )


TIGHT = Accountant(
    mechanism=NAME,
    name="tight",
    summary="totals then T means of all records: Gaussian mechanisms, composed exactly (GDP)",
    keys=(
        N,
        Key.of(ToyParams, "rows"),
        Key.of(ToyParams, "totals_noise"),
        SIGMA_Y,
        NOISE_RATIO,
    ),
    build=build,
)

SPEC = MechanismSpec(
    name=NAME,
    params=ToyParams,
    label_kind="proportions",  # noisy means of one-hot labels
    accounting=Accounting(
        accountants=(TIGHT,),
        # How the job reports progress, and shipping a copy of released totals, change no cost.
        release_only=frozenset({"own_progress", "with_weights", "postprocess"}),
    ),
    guidance=Guidance(
        summary="Test only: noisy feature totals, then T noisy means of all records",
        output="X: rows × n_features noisy means; y: rows × n_classes noisy mean labels; NPZ also "
        "holds the noisy totals",
    ),
    admission=Admission(
        title="ToyAverageRequest",
        check=check,
        work=work,
    ),
    execution=Execution(
        release=release,
    ),
    audit=AuditSpec(
        keys=(
            audit_keys.N,
            Key.of(ToyParams, "rows", help="T", default=4),
            # Totals so noisy they cost next to nothing: the audit sees only the means.
            Key.of(ToyParams, "totals_noise", default=1e6),
            audit_keys.NOISE_RATIO,
        ),
        case=audit_case,
    ),
)


def on_gpu() -> MechanismSpec:
    """The toy, its jobs sent to the GPU workers' queue."""
    return dataclasses.replace(SPEC, execution=dataclasses.replace(SPEC.execution, queue="gpu"))
