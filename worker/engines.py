"""Which engine draws a release's rows (docs/scaling.md, "Running releases on Dask"): the
stored parts of a split (``worker.shards``), the mechanism's Dask job, or the single-machine
generator, as peers. ``choose`` picks one before anything is built, building the mechanism's
distributed job at most once; ``engine_for`` hands the rows of the chosen one to the writer.

``DPRELEASE_RELEASE_ENGINE=local`` (the default): the rows come from the single-machine
generator ``build`` returned. ``dask``: when the mechanism's ``Execution.distributed``
builds a job for the release's params (no ``Unsupported``), the rows come from that job on
``dask.distributed`` (``worker/dask_release.py``) instead; everything else of the release
(metadata, the transform back to raw units, formats, upload claim, ledger) stays the runner's.

One draw of everything: ``build`` only prepares a lazy generator for the configurations a job
exists for (DP statistics and DP class sizes, drawn at build time, are refused by the job
builders), and this module checks it rather than trusts it: when the release's source has
drawn anything during ``build``, or the build's output would need something the job does not
make (post-processing, further arrays or artifacts, another transform or row count), the
release runs locally with the build's own rows. Otherwise the build's generator is closed
without ever being started and the published rows are the Dask job's only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from dpcore.distributed.jobs import ClassJob, Declared, RecordJob, Unsupported
from dpcore.distributed.tasks import FreshKeys, NoiseSpec
from dpcore.mechanisms import registry
from dpcore.mechanisms.contract import ReleaseOutput
from dpcore.mechanisms.noise import DeclaredNoise, NoiseSampler
from dpcore.mechanisms.run import params_of
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.sharding import ShardPlan
from dpcore.preprocessing import RowTransform
from service.datasets.parsing import ParsedDataset
from worker import shards
from worker.staging import Staging

log = logging.getLogger(__name__)

LABEL = "label"


@dataclass(frozen=True)
class Choice:
    """Which engine draws a release's rows, chosen before anything is built or drawn, from
    the settings, the mechanism's spec and the release's public parameters: the stored parts
    of a split (``plan``, ``worker.shards``), the mechanism's Dask job (``job``), or else the
    single-machine generator ``build`` returns."""

    mechanism: str
    plan: ShardPlan | None = None
    job: RecordJob | ClassJob | None = None


@dataclass(frozen=True)
class Engine:
    """The output whose ``chunks`` the runner streams, and which engine draws them."""

    output: ReleaseOutput
    name: str  # "local" or "dask": the release metadata's "engine"


def choose(
    settings: Any,
    mechanism: str,
    params: dict[str, Any],
    parsed: ParsedDataset,
    noise: Any,
    *,
    plan_key: str | None = None,
) -> Choice:
    """The engine of a release: the split named ``plan_key`` (a sharded release's finaliser);
    the Dask job where the dask engine is configured and the mechanism has one for these
    params (never sharded then: sharding splits one machine's draw); the split the settings
    give (``shards.plan_for``); or else the single machine."""
    if plan_key is not None:
        return Choice(mechanism, plan=shards.plan_named(mechanism, plan_key))
    if settings.release_engine == "dask":
        job = distributed_job(mechanism, params, parsed, noise)
        if job is not None:
            return Choice(mechanism, job=job)
    return Choice(mechanism, plan=shards.plan_for(settings, mechanism, params, len(parsed.classes)))


def engine_for(
    choice: Choice,
    settings: Any,
    parsed: ParsedDataset,
    output: ReleaseOutput,
    *,
    noise: Any,
    sampler: NoiseSampler,
    generator: SecureRandom,
    staging: Staging,
) -> Engine:
    """The runner's call right after ``build`` of an unsharded release: ``output`` unchanged
    (local), or with its ``chunks`` replaced by the Dask job's rows (the build's generator
    closed unstarted). ``sampler`` and ``generator``: the release's (``randomness``), which
    the Dask path never draws from; the secure sampler is given the plans the workers use, so
    the metadata's ``noise_lattices`` describe the noise published. ``staging``: where the
    Dask rows stage the partitions (``worker.staging``), at their first chunk."""
    job = choice.job
    if job is None:
        return Engine(output, "local")
    reason = _mismatch(job, output, generator)
    if reason is not None:
        log.warning(
            "release of %s runs locally under the dask engine: %s", choice.mechanism, reason
        )
        return Engine(output, "local")
    from worker import dask_release

    columns = dask_release.Columns(
        feature_columns(parsed.n_features), LABEL, tuple(range(len(parsed.classes)))
    )
    declared = DeclaredNoise(sampler, noise)
    plan = getattr(sampler, "plan", None)
    for call in dask_release.noise_calls(job, parsed.n_rows, columns):
        # The declared scale (UndeclaredNoise before any cluster starts), planned as the
        # workers' DeclaredNoise plans it: no draw.
        scale = declared.scale_for(sigma=call.sigma, sensitivity=call.sensitivity)
        if callable(plan):
            plan(
                sigma=scale.sigma,
                sensitivity=scale.sensitivity,
                dim=call.dim,
                error=call.error,
                unit=min(call.sensitivity, scale.sensitivity),
            )
    # The build's generator is never started: nothing of it is drawn or published.
    close = getattr(output.chunks, "close", None)
    if close is not None:
        close()
    rows = _dask_rows(
        settings,
        job,
        parsed,
        staging,
        columns,
        noise=NoiseSpec(sampler.name, noise),
        expected=output.rows,
    )
    return Engine(replace(output, chunks=rows), "dask")


def distributed_job(
    mechanism: str, params: dict[str, Any], parsed: ParsedDataset, noise: Any
) -> RecordJob | ClassJob | None:
    """The mechanism's job for these params, or None where it has none (dispatch through
    ``spec.execution.distributed`` only)."""
    spec = registry.get(mechanism)
    if spec.execution.distributed is None:
        return None
    declared = Declared(
        lo=np.asarray(parsed.lo, dtype=np.float64),
        hi=np.asarray(parsed.hi, dtype=np.float64),
        feature_shape=tuple(parsed.feature_shape),
        n_classes=len(parsed.classes),
    )
    try:
        job = spec.execution.distributed(params_of(spec, params), declared, noise)
    except Unsupported:
        return None
    assert isinstance(job, RecordJob | ClassJob)
    return job


def _mismatch(
    job: RecordJob | ClassJob, output: ReleaseOutput, generator: SecureRandom
) -> str | None:
    """Why the Dask job's rows could not stand in for the build's, or None."""
    if generator.position != 0:
        return "the single-machine build drew randomness already"
    if output.postprocess is not None or output.extra or output.artifacts:
        return "the output has post-processing, arrays or artifacts the job does not make"
    if output.progress != "rows":
        return "the generator reports its own progress"
    if output.transform is None or not same_transform(output.transform, job.transform):
        return "the job's transform differs from the published one"
    return None


def same_transform(a: RowTransform, b: RowTransform) -> bool:
    arrays = ("lo", "hi", "shift", "scale")
    return all(
        np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f))) for f in arrays
    ) and (a.clip_norm, a.divisor, a.output) == (b.clip_norm, b.divisor, b.output)


def feature_columns(d: int) -> tuple[str, ...]:
    return tuple(f"f{j}" for j in range(d))


def _dask_rows(
    settings: Any,
    job: RecordJob | ClassJob,
    parsed: ParsedDataset,
    staging: Staging,
    columns: Any,
    *,
    noise: NoiseSpec,
    expected: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The job's rows, chunk by chunk. At the first chunk asked for, the parsed dataset (the
    features clipped into the declared bounds, float64; labels as class indices: what the
    single machine reads) is staged and the cluster started; both go however the iteration
    ends (exhausted, raised, or closed by the writer)."""
    from worker import dask_release

    client = None
    try:
        parts = staging.stage(
            np.asarray(parsed.X, dtype=np.float64),
            np.asarray(parsed.labels, dtype=np.int64),
            columns,
            settings.dask_row_group_rows,
        )
        client = dask_release.client_from_settings(settings)
        done = 0
        for x, y in dask_release.run_job(
            client, job, parts, columns, noise=noise, keys=FreshKeys()
        ):
            done += int(x.shape[0])
            if done > expected:
                raise RuntimeError(f"the Dask job made more than the {expected} rows declared")
            yield x, y
        if done != expected:
            raise RuntimeError(f"the Dask job made {done} rows, {expected} were declared")
    finally:
        try:
            if client is not None:
                cluster = getattr(client, "cluster", None)
                client.close()
                if settings.dask_scheduler is None and cluster is not None:
                    cluster.close()
        finally:
            # Last: the client's close releases the job's tasks; one still running may find
            # its partition gone, and its result is dropped anyway.
            staging.clear()
