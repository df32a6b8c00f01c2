"""Writing a release's files in the job's scratch directory: the mechanism is built, its rows
(from the engine the job chose) go through the row steps into the artifact file, and its
further files are written beside it. Nothing here stores or records anything."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpcore.artifacts import ArtifactWriter
from dpcore.categorical import encoded_names
from dpcore.domain import DESCRIPTION as DOMAIN
from dpcore.domain import MissingIndicator, in_data_units, into_domain
from dpcore.mechanisms import registry, sharding
from dpcore.mechanisms.contract import ExtraArtifact, ReleaseOutput
from dpcore.mechanisms.noise import NoiseSampler, SecureNoise
from dpcore.mechanisms.run import build, randomness
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import RowTransform
from dpcore.release_layout import Layout
from service.datasets.parsing import ParsedDataset
from service.releases import keys, lifecycle
from service.releases.mechanisms import VALUE_BYTES
from service.runtime import Runtime
from worker import engines, shards, staging
from worker import progress as progress_of
from worker.ahead import ahead
from worker.job import Job
from worker.metadata import (
    METADATA_ARTIFACT,
    PublicFacts,
    array_artifact,
    published_classes,
    release_metadata,
    versions,
)
from worker.progress import ROWS_PHASE, SHARDS_SHARE, Progress
from worker.rows_copy import RowsCopy
from worker.uploads import EarlyUploads


class InsufficientDisk(Exception):
    """Too little free disk for the files a job is about to write: it fails before writing,
    before any upload claim; charged all the same, as the job has read the private data."""


@dataclass(frozen=True)
class ExtraFile:
    """A further file of the release, written into the job's scratch directory."""

    record: lifecycle.ArtifactRecord  # name, media type, description
    path: Path


@dataclass(frozen=True)
class Written:
    """What ``write_release`` produced: the artifact's metadata and the further files."""

    meta: dict[str, Any]
    extras: tuple[ExtraFile, ...] = ()
    raw: Path | None = None  # the rows as drawn, when the release was post-processed


def device_of(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def write_release(
    runtime: Runtime,
    job: Job,
    parsed: ParsedDataset,
    device: torch.device,
    path: Path,
    choice: engines.Choice,
    uploads: EarlyUploads | None = None,
) -> Written:
    """Run the mechanism, stream its chunks into the artifact file and write its further
    files beside it; return the metadata and those files. Sharded (``choice.plan``): the rows
    are the stored parts', and the mechanism is only built (for its description), with
    randomness that refuses every draw. ``uploads``: where the artifact and the raw copy
    start going up as they are written (``worker.uploads``)."""
    classes = published_classes(parsed)  # before anything is drawn
    plan = choice.plan
    # A fresh secret key per attempt, never stored: knowing it would reveal subsets and noise.
    generator, sampler = randomness(job.noise_sampler) if plan is None else sharding.sealed()
    # Sharded: the shards filled the bar's first SHARDS_SHARE; assembling fills the rest.
    start, share = (0.0, 1.0) if plan is None else (SHARDS_SHARE, 1 - SHARDS_SHARE)
    progress = progress_of.of_attempt(
        runtime, job.release_id, job.attempt, lambda fraction: start + share * fraction
    )
    output = build(
        job.mechanism,
        job.params,
        parsed,
        noise=job.noise,
        sampler=sampler,
        generator=generator,
        device=device,
        report=progress.report,
    )
    engine, parts = _engine(runtime, job, parsed, choice, output, sampler, generator, path)
    output = engine.output
    if output.progress == "rows":
        progress.report(0, output.rows, ROWS_PHASE)
    check_artifacts(output.artifacts)
    width = len(output.feature_names) + len(classes)
    steps = RowSteps.of(output, parsed)
    post = output.postprocess is not None
    check_disk(runtime, path.parent, disk_need(output.rows, width, job.fmt, post, steps.maps_rows))
    # The table's columns: the dataset's names, the label as its kind allows.
    layout = release_layout(job, output.feature_names, classes, in_domain=steps.maps_rows)
    meta = release_metadata(
        job,
        PublicFacts.of(parsed),
        preprocessing=output.preprocessing,
        artifacts=output.artifacts,
        device=device.type,
        versions=versions(),
        engine=engine.name,
        shards=None if plan is None else shards.describe(plan),
        arrays=list(output.extra),
        transform=output.transform,
        layout=layout.describe(),
    )
    if steps.maps_rows:
        meta = {**meta, "preprocessing": {**meta["preprocessing"], "domain": DOMAIN}}
    size_hint = output.rows * width * VALUE_BYTES[job.fmt]
    uploads = uploads or EarlyUploads(None)
    raw_path = _write_rows(job, output, steps, meta, layout, path, progress, uploads, size_hint)
    extras = list(format_companions(job.fmt, path.parent, meta, output.extra))
    extras += _mechanism_files(output.artifacts, path.parent)
    if isinstance(sampler, SecureNoise):
        # Lattice and raised σ per noised vector: functions of public parameters only.
        meta = {**meta, "noise_lattices": sampler.describe()}
    elif parts is not None and parts.lattices:
        meta = {**meta, "noise_lattices": parts.lattices}
    return Written(meta, tuple(extras), raw_path)


def _engine(
    runtime: Runtime,
    job: Job,
    parsed: ParsedDataset,
    choice: engines.Choice,
    output: ReleaseOutput,
    sampler: NoiseSampler,
    generator: SecureRandom,
    path: Path,
) -> tuple[engines.Engine, shards.Parts | None]:
    """The engine whose chunks are written: the stored parts (sharded), the Dask job's rows,
    or the build's own generator."""
    if choice.plan is None:
        engine = engines.engine_for(
            choice,
            runtime.settings,
            parsed,
            output,
            noise=job.noise,
            sampler=sampler,
            generator=generator,
            staging=staging.staging_for(
                runtime.settings, runtime.store, job.release_id, job.attempt, path.parent / "dask"
            ),
        )
        return engine, None
    if output.rows != choice.plan.rows or output.artifacts or output.extra:
        raise RuntimeError("a sharded release must be rows alone, as many as its plan's")
    parts = shards.Parts(
        runtime.store, job.release_id, choice.plan, len(output.feature_names), path.parent
    )
    return engines.Engine(replace(output, chunks=parts.chunks()), "local"), parts


@dataclass(frozen=True)
class RowSteps:
    """What becomes of each drawn chunk on its way into the files, all post-processing: back
    to raw units (the public transform's inverse), then, for rows in the dataset's own units,
    into the declared domain (``dpcore.domain``: values clipped to the declared bounds, one
    category per row of each declared categorical column)."""

    transform: RowTransform | None
    blocks: tuple[tuple[int, ...], ...]
    # The declared (lo, hi) per feature where the rows are the dataset's own features in raw
    # units; None for releases in another space (projections, signed combinations).
    bounds: tuple[np.ndarray, np.ndarray] | None = None
    # The declared missing-value indicators (their features and fills).
    indicators: tuple[MissingIndicator, ...] = ()
    # The features of the columns declared integer, rounded.
    integers: tuple[int, ...] = ()
    # Draws the categories and indicators: post-processing randomness, independent of the
    # data.
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    @classmethod
    def of(cls, output: ReleaseOutput, parsed: ParsedDataset) -> RowSteps:
        # Only a release of records (or their means) in the dataset's own feature space has
        # the declared domain (random projection's features are projections, SGDRM's signed
        # combinations: nothing to map there).
        transform = output.transform
        if not in_data_units(output.feature_names, parsed.feature_names, transform):
            return cls(transform, ())
        return cls(
            transform,
            parsed.categorical_blocks,
            (parsed.lo, parsed.hi),
            parsed.missing_indicators,
            parsed.integer_features,
        )

    @property
    def maps_rows(self) -> bool:
        return self.bounds is not None

    def raw_units(self, x: np.ndarray) -> np.ndarray:
        return self.transform.to_raw(x) if self.transform is not None else x

    def in_domain(self, drawn: np.ndarray) -> np.ndarray:
        """Rows already in raw units mapped into the declared domain (unchanged where the
        domain does not apply)."""
        if self.bounds is None:
            return drawn
        return into_domain(
            drawn, *self.bounds, self.blocks, self.rng, self.indicators, self.integers
        )

    def decode(self, x: np.ndarray) -> np.ndarray:
        return self.in_domain(self.raw_units(x))


def _write_rows(
    job: Job,
    output: ReleaseOutput,
    steps: RowSteps,
    meta: dict[str, Any],
    layout: Layout,
    path: Path,
    progress: Progress,
    uploads: EarlyUploads,
    size_hint: int,
) -> Path | None:
    """Stream the output's chunks into the artifact file at ``path``. The drawn rows go to
    the owner's raw file (returned) whenever the release's rows are not them: post-processed
    (through a scratch copy the post-processing reads twice: fit, transform), or mapped into
    the declared domain where that changed any value (otherwise the raw file is dropped).
    Both files start going up as they are written (``uploads``); the raw file's upload only
    once it is sure to be kept."""
    post = output.postprocess
    counts_rows = output.progress == "rows"
    writer_args: dict[str, Any] = {"rows": output.rows, "extra": output.extra}
    keep_raw = post is not None or steps.maps_rows
    raw_path = path.parent / f"raw.{job.fmt}" if keep_raw else None
    raw_meta = {
        **meta,
        "preprocessing": {**meta["preprocessing"], "postprocess": "none: the rows as drawn"},
        "raw": "the owner's copy of the rows as drawn, before the release's post-processing",
    }
    # The rows as drawn are not in the declared domain: the encoded features, not the table.
    raw_layout = replace(layout, as_drawn=True, table=())
    done = 0
    altered = post is not None
    release_settled = uploads.follow(job.artifact_key, path, size_hint)
    raw_settled = None
    if raw_path is not None:
        raw_settled = uploads.follow(job.raw_key, raw_path, size_hint, start=altered)
    with ExitStack() as stack:
        # Closed when the rows stop, however: a generator that holds resources (the Dask
        # engine's cluster and staged partitions) releases them now, not when it is collected.
        close = getattr(output.chunks, "close", None)
        if close is not None:
            stack.callback(close)
        # Drawn a chunk ahead in a thread of their own; that thread is joined (closed first,
        # before the callback above) before anything here is cleaned up.
        rows = stack.enter_context(closing(ahead(output.chunks)))
        writer = stack.enter_context(
            ArtifactWriter(
                job.fmt,
                raw_path or path,
                metadata=raw_meta if keep_raw else meta,
                layout=raw_layout if keep_raw else layout,
                on_settled=raw_settled if keep_raw else release_settled,
                **writer_args,
            )
        )
        copy = stack.enter_context(RowsCopy(path.parent, output.rows, enabled=post is not None))
        # Mapped into the domain only: the release is written in the same pass.
        direct = None
        if keep_raw and post is None:
            direct = stack.enter_context(
                ArtifactWriter(
                    job.fmt,
                    path,
                    metadata=meta,
                    layout=layout,
                    on_settled=release_settled,
                    **writer_args,
                )
            )
        for mixed_x, mixed_y in rows:
            x, y = mixed_x.cpu().numpy(), mixed_y.cpu().numpy()
            if not keep_raw:
                writer.write(steps.decode(x), y)
            else:  # the owner's raw copy keeps the rows as drawn
                drawn = steps.raw_units(x)
                writer.write(drawn, y)
                if direct is not None:
                    mapped = steps.in_domain(drawn)
                    if not altered and not np.array_equal(mapped, drawn):
                        altered = True  # the raw file is kept: its upload starts
                        assert raw_path is not None
                        uploads.start(raw_path)
                    direct.write(mapped, y)
            if post is not None:
                post.fit(x, y)
                copy.write(x, y)
            done += mixed_x.shape[0]
            if counts_rows:
                progress.report(done, output.rows, ROWS_PHASE)
            else:
                progress.tick()  # the generator's own figures; a cancel is still noticed
        if post is not None:
            with ArtifactWriter(
                job.fmt,
                path,
                metadata=meta,
                layout=layout,
                on_settled=release_settled,
                **writer_args,
            ) as processed:
                for x, y in copy.chunks():
                    px, py = post.transform(x, y)
                    processed.write(steps.decode(px), py)
                    progress.tick()
    if raw_path is not None and not altered:
        uploads.drop(raw_path)
        raw_path.unlink()  # every drawn row was already in the domain: the release is them
        return None
    return raw_path


def _mechanism_files(artifacts: tuple[ExtraArtifact, ...], where: Path) -> list[ExtraFile]:
    """The mechanism's further files, written after the chunks: a generator's further files
    (trained weights) are complete then."""
    extras = []
    for artifact in artifacts:
        extra_path = where / "artifacts" / artifact.name
        extra_path.parent.mkdir(exist_ok=True)
        artifact.write(extra_path)
        if not extra_path.is_file():
            raise RuntimeError(f"the mechanism did not write its artifact {artifact.name}")
        record = lifecycle.ArtifactRecord(artifact.name, artifact.media_type, artifact.description)
        extras.append(ExtraFile(record, extra_path))
    return extras


def disk_need(rows: int, width: int, fmt: str, postprocessed: bool, mapped: bool = False) -> int:
    """Bytes of disk a job writes for ``rows`` rows of ``width`` values: the release file (an
    NPZ twice over while it is written: its float32 memory maps, then the zip of them); for
    rows mapped into the domain also the owner's raw file; for a post-processed release that
    and a float32 scratch copy."""
    one = rows * width * VALUE_BYTES[fmt] * (2 if fmt == "npz" else 1)
    if postprocessed:
        return 2 * one + rows * width * 4
    return 2 * one if mapped else one


def check_disk(runtime: Runtime, where: Path, need: int) -> None:
    """Fail before writing when the scratch disk cannot hold the job's files plus the margin
    (a full disk mid-job fails later, and starves every other job and tenant meanwhile)."""
    margin = runtime.settings.scratch_margin_bytes
    free = shutil.disk_usage(where).free
    if free < need + margin:
        raise InsufficientDisk(
            f"not enough free disk to write this release: it needs about {need} bytes (plus "
            f"a margin of {margin}) in the scratch space and {free} are free. Nothing was "
            "written or released; its charge stands all the same, as the job had read the "
            "private data (docs/privacy.md, 'Failures and cancellations'). Ask again once "
            "space is freed, or for fewer rows"
        )


def release_layout(
    job: Job, feature_names: Sequence[str], classes: list[Any], *, in_domain: bool = False
) -> Layout:
    """The release table's columns: the declared columns where the rows are the dataset's own
    features mapped into its declared domain (``in_domain``), else the features as the
    mechanism names them (the dataset's own, or a projection's); then the label under the
    dataset's label column name (NPZ uploads have none:
    ``dpcore.release_layout.DEFAULT_LABEL``), as the mechanism's kind gives it."""
    kind = registry.get(job.mechanism).label_kind
    declared = None
    if in_domain and job.metadata.columns is not None:
        declared = [c.model_dump(mode="json") for c in job.metadata.columns]
        if encoded_names(declared) != list(feature_names):
            declared = None  # an NPZ upload's columns name no features of its own
    return Layout.of(feature_names, job.metadata.label_column, kind, classes, declared=declared)


def format_companions(
    fmt: str, where: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]
) -> Iterator[ExtraFile]:
    """The further files a release in ``fmt`` needs to carry what an NPZ holds inside: the
    metadata (CSV) and the mechanism's public arrays (CSV, Parquet). The metadata is the very
    JSON embedded in NPZ and Parquet releases; the arrays are data-independent (drawn from the
    release's secure source or fixed), as ``ReleaseOutput.extra`` requires."""
    if fmt == "npz":
        return
    folder = where / "artifacts"
    folder.mkdir(exist_ok=True)
    if fmt == "csv":
        path = folder / METADATA_ARTIFACT
        path.write_text(json.dumps(meta, sort_keys=True))
        yield ExtraFile(
            lifecycle.ArtifactRecord(
                METADATA_ARTIFACT,
                "application/json",
                "The release's metadata (columns, preprocessing, mechanism, noise, charge): "
                "what NPZ and Parquet releases embed, beside a CSV release",
            ),
            path,
        )
    for name, array in arrays.items():
        path = folder / array_artifact(name)
        np.save(path, np.asarray(array), allow_pickle=False)
        yield ExtraFile(
            lifecycle.ArtifactRecord(
                array_artifact(name),
                "application/x-npy",
                f"The mechanism's public array {name!r} (an NPZ release holds it inside), "
                "needed to use the release",
            ),
            path,
        )


def check_artifacts(artifacts: tuple[ExtraArtifact, ...]) -> None:
    """A mechanism's further files need distinct names that are safe object-key segments (a
    programming error of the mechanism otherwise: the release fails before any claim)."""
    names = [a.name for a in artifacts]
    reserved = [n for n in names if n == METADATA_ARTIFACT or n.endswith(".npy")]
    if reserved:  # the format companions' names
        raise ValueError(f"artifact names {reserved} are reserved")
    bad = [n for n in names if not keys.valid_artifact_name(n)]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"the mechanism's artifact names are invalid or repeated: {names}")
