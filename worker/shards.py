"""Sharded releases (``dpcore.mechanisms.sharding`` says when a release may be split and why
the split has the unsplit release's law).

A release of more than ``shard_rows`` rows by a shardable mechanism runs as:

1. the coordinator (the release's ordinary job, ``worker.runner``) plans the split from public
   facts and hands every missing shard to the workers (Celery: one ``run_shard`` task each, on
   the release's own queue, its mechanism's pool and its lane; embedded mode: one after the
   other, in this thread);
2. each shard draws its rows with its own secure source (a fresh 256-bit OS key, as every
   release's), claims the release's upload (from then on the release stays charged: the
   ledger's rule "output may exist ⇒ charged" covers parts like the artifact) and stores its
   part create-only; the shard that finds every part stored hands the release to the finaliser;
3. the finaliser (the runner again, same attempt) builds the release's description with
   randomness that refuses every draw, streams the parts into the one artifact through the
   ordinary writer (post-processing, raw units, formats, companions unchanged), publishes it
   and settles the release once; the parts are then deleted.

The ledger charges the release once, at admission, whatever the number of shards. A part is
keyed by the release and the split, not by the attempt: a shard that died is drawn again by
its redelivery (nothing of it was stored) and a stored part is never drawn again — every part
is one independent draw of the same law, used once. Parts are never served.
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from dpcore.mechanisms import registry, sharding
from dpcore.mechanisms.run import build, params_of, randomness
from dpcore.mechanisms.sharding import ShardPlan
from service.releases import keys
from service.runtime import Route
from service.storage import ObjectExists, ObjectStore

log = logging.getLogger(__name__)

ROWS_MEMBER = "rows.npy"
META_MEMBER = "part.json"
# Rows per chunk when a part is read back.
READ_ROWS = 8192
# Bytes per read when a part is copied from the store to the scratch space.
COPY_BYTES = 8 << 20


@runtime_checkable
class ShardDispatcher(Protocol):
    """A dispatcher that hands shards and finalisers to other workers (Celery). One without
    these methods (embedded mode) has the coordinator run the shards itself."""

    def enqueue_shard(
        self, release_id: str, attempt: int, index: int, plan: str, route: Route
    ) -> None: ...

    def enqueue_finish(self, release_id: str, attempt: int, plan: str, route: Route) -> None: ...


def plan_for(
    settings: Any, mechanism: str, params: dict[str, Any], n_classes: int
) -> ShardPlan | None:
    """The split of this release under ``settings`` (``shard_rows``, ``max_shards``)."""
    spec = registry.get(mechanism)
    return sharding.plan(
        spec.execution.shard,
        params_of(spec, params),
        n_classes=n_classes,
        shard_rows=settings.shard_rows,
        max_shards=settings.max_shards,
    )


def plan_named(mechanism: str, key: str) -> ShardPlan:
    shard = registry.get(mechanism).execution.shard
    if shard is None:
        raise ValueError(f"{mechanism} cannot be sharded")
    return sharding.from_key(shard.rows_param, key)


def part_key(release_id: str, plan: ShardPlan, index: int) -> str:
    return keys.shard_part(release_id, plan.key, index)


def missing(store: ObjectStore, release_id: str, plan: ShardPlan) -> list[int]:
    return [j for j in range(plan.count) if not store.exists(part_key(release_id, plan, j))]


def discard(store: ObjectStore, release_id: str) -> None:
    """Delete every part of the release (settled: published, failed or cancelled). Best
    effort: a part left behind is never served, and the next settlement removes it."""
    try:
        removed = store.delete_prefix(keys.shard_prefix(release_id))
    except Exception:
        log.warning("release %s: could not delete its shard parts", release_id, exc_info=True)
        return
    if removed:
        log.info("release %s: deleted %d shard part(s)", release_id, removed)


def count_try(store: ObjectStore, release_id: str, plan: ShardPlan, index: int, limit: int) -> int:
    """Record one more try of shard ``index`` and return its number (1, 2, …), at most
    ``limit + 1``. A shard whose worker dies is redelivered by the broker without any count
    (late acknowledgement); these create-only markers bound the tries as the release's
    attempt counter bounds its job's."""
    for number in range(1, limit + 2):
        try:
            store.put(f"{part_key(release_id, plan, index)}.try-{number}", b"")
        except ObjectExists:
            continue
        return number
    return limit + 1


# --- drawing a part ------------------------------------------------------------------------


@dataclass(frozen=True)
class Drawn:
    path: Path
    rows: int
    lattices: list[dict[str, float]] | None


def draw(
    mechanism: str,
    params: dict[str, Any],
    plan: ShardPlan,
    index: int,
    data: Any,
    *,
    noise: Any,
    noise_sampler: str,
    device: torch.device,
    path: Path,
    report: Callable[[float, float, str], None],
) -> Drawn:
    """Shard ``index``: the mechanism's rows for the shard's parameters, drawn with a fresh
    secure source and written to ``path`` (an uncompressed zip of the float32 rows, features
    then labels, and the sampler's public lattice description)."""
    spec = registry.get(mechanism)
    generator, sampler = randomness(noise_sampler)  # a fresh OS key: independent of every shard
    output = build(
        spec,
        plan.params_of(params_of(spec, params), index),
        data,
        noise=noise,
        sampler=sampler,
        generator=generator,
        device=device,
        report=report,
    )
    expected = plan.rows_of(index)
    if output.rows != expected:
        raise RuntimeError(f"shard {index} makes {output.rows} rows, its plan {expected}")
    done = 0
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive,
        archive.open(ROWS_MEMBER, "w", force_zip64=True) as member,
    ):
        for x, y in output.chunks:
            block = np.hstack([x.cpu().numpy(), y.cpu().numpy()]).astype("<f4", copy=False)
            if done == 0:
                np.lib.format.write_array_header_2_0(
                    member,
                    {"descr": "<f4", "fortran_order": False, "shape": (expected, block.shape[1])},
                )
            member.write(np.ascontiguousarray(block).tobytes())
            done += len(block)
            report(done, expected, "rows")
        if done != expected:
            raise RuntimeError(f"shard {index} drew {done} rows, its plan {expected}")
    describe = getattr(sampler, "describe", None)
    lattices = describe() if callable(describe) else None
    with zipfile.ZipFile(path, "a", zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr(
            META_MEMBER, json.dumps({"index": index, "rows": done, "noise_lattices": lattices})
        )
    return Drawn(path, done, lattices)


def store_part(
    store: ObjectStore, release_id: str, plan: ShardPlan, index: int, path: Path
) -> bool:
    """Store the part create-only; False when another delivery stored this shard first (this
    draw is then discarded, never published)."""
    try:
        store.put_file(part_key(release_id, plan, index), path)
    except ObjectExists:
        log.info("release %s: shard %d was stored by another delivery", release_id, index)
        return False
    return True


# --- reading the parts back ----------------------------------------------------------------


@dataclass
class Parts:
    """The stored parts of a split, read back in order as the release's chunks. Each part is
    copied to ``scratch`` (one at a time), streamed in chunks of rows, then removed."""

    store: ObjectStore
    release_id: str
    plan: ShardPlan
    n_features: int
    scratch: Path
    lattices: list[dict[str, float]] | None = None

    def chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.plan.count):
            local = self.scratch / f"part-{index:05d}.npz"
            self._copy(part_key(self.release_id, self.plan, index), local)
            try:
                yield from self._read(local, index)
            finally:
                local.unlink(missing_ok=True)

    def _copy(self, key: str, local: Path) -> None:
        stream = self.store.open_stream(key, chunk_bytes=COPY_BYTES)
        try:
            with local.open("wb") as handle:
                for block in stream.chunks:
                    handle.write(block)
        finally:
            stream.close()

    def _read(self, local: Path, index: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with zipfile.ZipFile(local) as archive:
            meta = json.loads(archive.read(META_MEMBER))
            if meta.get("index") != index or meta.get("rows") != self.plan.rows_of(index):
                raise RuntimeError(f"shard part {index} does not match its plan: {meta}")
            self._note_lattices(meta.get("noise_lattices"))
            with archive.open(ROWS_MEMBER) as member:
                if np.lib.format.read_magic(member) != (2, 0):
                    raise RuntimeError(f"shard part {index} is not a part this version wrote")
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
                rows, width = shape
                if fortran or dtype != np.dtype("<f4") or width <= self.n_features:
                    raise RuntimeError(f"shard part {index} has an unexpected layout")
                row_bytes = width * 4
                for start in range(0, rows, READ_ROWS):
                    count = min(READ_ROWS, rows - start)
                    raw = member.read(count * row_bytes)
                    if len(raw) != count * row_bytes:
                        raise RuntimeError(f"shard part {index} is truncated")
                    block = np.frombuffer(raw, dtype="<f4").reshape(count, width)
                    yield (
                        torch.from_numpy(block[:, : self.n_features].copy()),
                        torch.from_numpy(block[:, self.n_features :].copy()),
                    )

    def _note_lattices(self, lattices: list[dict[str, float]] | None) -> None:
        # Functions of public parameters, the same in every shard: kept once (the union, so a
        # difference would show in the metadata rather than be hidden).
        if not lattices:
            return
        seen = {json.dumps(x, sort_keys=True) for x in self.lattices or []}
        for entry in lattices:
            if json.dumps(entry, sort_keys=True) not in seen:
                self.lattices = [*(self.lattices or []), entry]
                seen.add(json.dumps(entry, sort_keys=True))


def describe(plan: ShardPlan) -> dict[str, Any]:
    """The metadata's account of the split (public: a function of the parameters and the
    service's settings)."""
    return {
        "count": plan.count,
        "rows": [plan.rows_of(j) for j in range(plan.count)],
        "randomness": "each shard drew with its own secure source under a fresh 256-bit key "
        "from the OS CSPRNG; rows are the shards' rows in shard order",
        "law": "the same as one unsharded draw of these parameters (docs/privacy.md, "
        "'Sharded releases'); charged once",
    }
