"""Where a release's objects live in the object store: the one place that names them.

Every key is a function of the release id alone (and the format, or an artifact's name), so
every attempt of a job writes, create-only, to the same keys, and a retry finds what an earlier
attempt stored.
"""

from __future__ import annotations

import re

# An extra artifact's name is one path segment a browser may save as is.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def prefix(release_id: str) -> str:
    return f"releases/{release_id}/"


def artifact(release_id: str, fmt: str) -> str:
    """The release file (the rows), served by GET /releases/{id}/download."""
    return f"{prefix(release_id)}release.{fmt}"


def raw(release_id: str, fmt: str) -> str:
    """The rows as drawn, before the release's free post-processing (owner only), served by
    GET /releases/{id}/raw; absent when the release asked for no post-processing."""
    return f"{prefix(release_id)}raw.{fmt}"


def converted(release_id: str, fmt: str) -> str:
    """The release file converted to another format on a first download in it (a function
    of the release file alone: post-processing), kept for later downloads."""
    return f"{prefix(release_id)}converted/release.{fmt}"


def public_metadata(release_id: str) -> str:
    """The metadata an NPZ or Parquet release file carries, kept beside it on a first
    request, served as the release's ``metadata.json`` (a CSV release stores its own)."""
    return f"{prefix(release_id)}converted/metadata.json"


def summary(release_id: str, version: int) -> str:
    """The summary of a succeeded release (GET /releases/{id}/summary: a function of the
    release file alone, post-processing), kept on its first request; ``version``: the
    summary's computation, so a changed one never serves an older answer."""
    return f"{prefix(release_id)}converted/summary-v{version}.json"


def metadata(release_id: str) -> str:
    """The owner-side provenance file (holds the raw data's hash: never served)."""
    return f"{prefix(release_id)}metadata.json"


def report(release_id: str) -> str:
    """The owner report (raw-data results: owner only)."""
    return f"{prefix(release_id)}report.json"


def valid_artifact_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def extra_artifact(release_id: str, name: str) -> str:
    """A further artifact of the release (a model's weights, say), served by
    GET /releases/{id}/artifacts/{name}."""
    if not valid_artifact_name(name):
        raise ValueError(
            f"artifact name {name!r} must be 1 to 100 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit"
        )
    return f"{prefix(release_id)}artifacts/{name}"


def shard_prefix(release_id: str) -> str:
    """Where a sharded release's parts wait for assembly (worker-side only: never served,
    deleted once the release is settled)."""
    return f"{prefix(release_id)}shards/"


def shard_part(release_id: str, plan: str, index: int) -> str:
    """Part ``index`` of the split named ``plan`` (``ShardPlan.key``): parts of another split
    of the same release never mix with it."""
    return f"{shard_prefix(release_id)}{plan}/part-{index:05d}.npz"


def staging_prefix(release_id: str) -> str:
    """Where a Dask release's jobs stage the parsed dataset as Parquet partitions for the
    cluster's tasks (``worker.staging``): private data, in the uploads' bucket, never served,
    deleted when the job ends and again once the release is settled."""
    return f"{prefix(release_id)}staging/"


def staging_part(folder: str, index: int) -> str:
    """Partition ``index`` of one job's staging ``folder`` (under ``staging_prefix``)."""
    return f"{folder}part-{index:05d}.parquet"
