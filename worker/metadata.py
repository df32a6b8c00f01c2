"""A release's metadata: what its file says about itself (the mechanism, its parameters and
noise, the charge, the public facts of the dataset, the columns). ``release_metadata`` is a
pure function of the values it is given."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from typing import Any

from dpcore.categorical import DECODING as CATEGORY_DECODING
from dpcore.mechanisms import registry
from dpcore.mechanisms.contract import ExtraArtifact
from dpcore.preprocessing import TRANSFORM_HELP, RowTransform
from service.datasets.parsing import ParsedDataset
from service.errors import ClassesUndeclared
from service.releases import noise as release_noise
from worker.job import Job

NOISE_SOURCES = {
    "secure": "secure: values rounded to a power-of-two lattice, exact rounded-Gaussian noise "
    "from the OS CSPRNG (docs/privacy.md, 'Hardened noise')",
    "fast": "fast: float Gaussian noise (Box-Muller) from the release's ChaCha20 stream keyed "
    "with 256 bits from the OS CSPRNG; NOT hardened against floating-point precision attacks",
}

# What a table format cannot hold travels beside it as further artifacts: CSV has no place
# for metadata, and neither CSV nor Parquet for a mechanism's arrays (a projection matrix),
# which an NPZ carries inside. The names are reserved for that.
METADATA_ARTIFACT = "metadata.json"


def array_artifact(name: str) -> str:
    return f"{name}.npy"


def published_classes(parsed: ParsedDataset) -> list[Any]:
    """The class names a release file carries (its label columns and metadata): the owner's
    declared label set, never the labels found in the data."""
    if not parsed.classes_declared:
        raise ClassesUndeclared("label names come only from declared classes")
    return list(parsed.classes)


@dataclass(frozen=True)
class PublicFacts:
    """What a release states of its dataset: the row count (the accountant's ``n``), the
    declared bounds, the feature names and shape, the declared classes."""

    n_rows: int
    feature_shape: tuple[int, ...]
    feature_names: tuple[str, ...]
    lo: list[float]
    hi: list[float]
    classes: tuple[Any, ...]

    @classmethod
    def of(cls, parsed: ParsedDataset) -> PublicFacts:
        return cls(
            n_rows=parsed.n_rows,
            feature_shape=tuple(parsed.feature_shape),
            feature_names=tuple(parsed.feature_names),
            lo=parsed.lo.tolist(),
            hi=parsed.hi.tolist(),
            classes=tuple(published_classes(parsed)),
        )


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("dprelease", "torch", "numpy", "dp-accounting", "scipy"):
        try:
            out[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            out[package] = "unknown"
    return out


def release_metadata(
    job: Job,
    facts: PublicFacts,
    *,
    preprocessing: dict[str, Any],
    artifacts: tuple[ExtraArtifact, ...],
    device: str,
    versions: dict[str, str],
    engine: str,
    shards: dict[str, Any] | None,
    arrays: Sequence[str],
    transform: RowTransform | None,
    layout: dict[str, Any],
) -> dict[str, Any]:
    """The release's metadata. ``engine``: which drew the rows; ``shards``: the split's
    account (sharded releases); ``arrays``: the mechanism's public arrays, each in the NPZ or
    beside the table as a further file; ``layout``: the table's columns."""
    further = (
        {
            "artifacts": [
                {"name": a.name, "media_type": a.media_type, "description": a.description}
                for a in artifacts
            ]
        }
        if artifacts
        else {}
    )
    meta: dict[str, Any] = {
        "release_id": job.release_id,
        "dataset_id": job.dataset_id,
        "mechanism": job.mechanism,
        "params": job.params,
        "noise": release_noise.from_description(job.noise, job.noise_sampler).model_dump(),
        "charge": {"epsilon": job.epsilon, "delta": job.delta},
        # First thing a reader of a research release's file must know: its ε is a claim only.
        **({"research": job.research} if job.research is not None else {}),
        "accountant": {
            "name": job.accountant,
            "method": registry.accountant(job.mechanism, job.accountant).summary,
            # Replace-one unless the parameters opt in to a narrower relation (DP-CDA's
            # declared class sizes): the ε above holds for this relation only.
            "neighbouring_relation": registry.get(job.mechanism).neighbours(job.params),
            "n": facts.n_rows,
        },
        "preprocessing": preprocessing,
        "columns": registry.get(job.mechanism).guidance.output,
        "feature_shape": list(facts.feature_shape),
        "feature_names": list(facts.feature_names),
        # The owner's declared (public) bounds, so analysts can preprocess their own data alike.
        "feature_range": {"lo": facts.lo, "hi": facts.hi},
        "classes": list(facts.classes),
        # The owner's declared (public) column schema, so a reader can decode the features.
        **(
            {
                "declared_columns": [c.model_dump(mode="json") for c in job.metadata.columns],
                "categorical_decoding": CATEGORY_DECODING,
            }
            if job.metadata.columns is not None
            else {}
        ),
        "noise_source": NOISE_SOURCES[job.noise_sampler],
        "sampling_source": "ChaCha20 keystream keyed with 256 bits from the OS CSPRNG "
        "(exact uniform subsets, exact Bernoulli rates)",
        "device": device,
        "versions": versions,
        "created_at": None if job.requested_at is None else job.requested_at.isoformat(),
        **further,
    }
    meta["engine"] = engine
    if shards is not None:
        meta["shards"] = shards
    if arrays:
        # Where each of the mechanism's public arrays travels (writing.format_companions).
        meta["arrays"] = {
            name: f"{name}.npy inside this NPZ" if job.fmt == "npz" else array_artifact(name)
            for name in arrays
        }
    if transform is not None:
        meta["transform"] = {
            **transform.to_metadata(),
            "description": TRANSFORM_HELP[transform.output],
        }
    meta["layout"] = layout
    return meta
