"""The contract between the runner and a mechanism's release generator: what it reads
(``PrivateData``, ``RunContext``) and what it answers (``ReleaseOutput``, ``ExtraArtifact``),
and the free post-processing it may ask for (``Postprocessor``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dpcore.accounting.events import NoiseDescription
    from dpcore.mechanisms.noise import NoiseSampler
    from dpcore.mechanisms.secure_random import SecureRandom
    from dpcore.preprocessing import RowTransform


class PrivateData(Protocol):
    """The raw dataset a job reads (``service.datasets.parsing.ParsedDataset`` is one)."""

    @property
    def X(self) -> np.ndarray: ...  # float64 (n, d), clipped into [lo, hi]
    @property
    def labels(self) -> np.ndarray: ...  # int64 (n,), index into ``classes``
    @property
    def classes(self) -> list[Any]: ...
    @property
    def lo(self) -> np.ndarray: ...
    @property
    def hi(self) -> np.ndarray: ...
    @property
    def feature_names(self) -> list[str]: ...
    @property
    def feature_shape(self) -> tuple[int, ...]: ...
    @property
    def n_rows(self) -> int: ...


Report = Callable[[float, float, str], None]


def _ignore(done: float, total: float, phase: str) -> None:
    return None


@dataclass
class RunContext:
    """What a release generator gets besides its parameters and data.

    ``sampler`` adds noise and accepts only the scales ``noise`` declares; ``generator`` (the
    release's secure source, ``dpcore.mechanisms.secure_random``) draws every other random
    choice of the mechanism; ``report(done, total, phase)`` records progress in the
    generator's own units (and raises ``Cancelled`` when the release was cancelled)."""

    noise: NoiseDescription
    sampler: NoiseSampler
    generator: SecureRandom
    device: torch.device
    report: Report = _ignore

    def sigma(self, name: str) -> float:
        return self.noise.sigma(name)


@dataclass(frozen=True)
class ExtraArtifact:
    """A file shipped beside the samples (a model's weights, say): ``write(path)`` writes it;
    it is stored create-only under the release's prefix as ``name``."""

    name: str
    media_type: str
    description: str
    write: Callable[[Path], None]


UNIT_SCALE: dict[str, Any] = {
    "features": "clip to the declared feature_range, scale to [0, 1], clip rows to L2 norm "
    "<= clip_norm and divide by it (the accountant's rows of norm <= 1); released in raw "
    "units (see transform)",
    "labels": "one-hot over the declared classes",
    "statistics": "none computed from the data",
}


class Postprocessor(Protocol):
    """Free post-processing of a release's rows (``dpcore.mechanisms.postprocess``): it may
    read the released rows and public facts only. ``fit`` sees every chunk, then
    ``transform`` maps every chunk; ``description`` goes into the release's metadata."""

    description: str

    def fit(self, X: np.ndarray, Y: np.ndarray) -> None: ...
    def transform(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class ReleaseOutput:
    """A generator's answer: ``rows`` (a public number) rows of (features, labels) in chunks,
    arrays that travel in an NPZ release (``extra``: data-independent ones such as a projection
    matrix), the preprocessing the metadata states, and further artifacts.

    ``progress``: "rows" — the runner counts rows as chunks arrive; "own" — the generator
    reports through ``RunContext.report`` (training jobs: iterations, epochs).

    ``postprocess``: applied by the runner to the whole release (two passes over the drawn
    rows); the rows as drawn are kept as the owner's raw release.

    ``transform``: the public map from raw records to the rows the mechanism read; the runner
    writes released features through ``transform.to_raw`` (raw units) and the metadata
    describes it. None: values are written as the mechanism made them."""

    rows: int
    feature_names: list[str]
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]]
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    preprocessing: dict[str, Any] = field(default_factory=lambda: dict(UNIT_SCALE))
    artifacts: tuple[ExtraArtifact, ...] = ()
    progress: Literal["rows", "own"] = "rows"
    postprocess: Postprocessor | None = None
    transform: RowTransform | None = None


Generator = Callable[[Any, PrivateData, RunContext], ReleaseOutput]
