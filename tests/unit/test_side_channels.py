"""No side channel in a mechanism's run: for the same coins, a release job on neighbouring
datasets does the same work in the same order.

The privacy analyses cover the released rows only. Anything else an analyst can observe about
a job (its progress reports, how many chunks it writes and how long each takes, how often and
on what it calls the noise sampler) must depend on public facts only: n, the shape, the
declared classes and the parameters. Here each mechanism's real release code runs on two
neighbours under replace-one (record 0 changed in features *and* class, so the class counts
differ by one) with the same generator seed, and a trace of the work is compared: every torch
operation the job runs with the shapes it reads and makes (through a ``TorchFunctionMode``:
the work's size, hence its time), the sampler's calls (shape, σ, sensitivity), the
generator's progress reports and the chunks' shapes, interleaved in the order they happened.
A loop over private counts (a gather sized by a class, say) shows up as a different trace.
Values are not traced: they are the rows, which the accountant covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from dpcore.mechanisms import registry
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from service.datasets.parsing import ParsedDataset, parse_dataset
from service.datasets.schemas import DatasetMetadata
from service.errors import ClassesUndeclared
from tests.datasets import unit_dataset
from worker.runner import published_classes

N, D, K = 60, 4, 3


def _sizes(value: Any) -> Any:
    """The shapes (and integers: sizes, counts) in an operation's arguments or result."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, bool | int | torch.Size):
        return value
    if isinstance(value, list | tuple):
        return tuple(_sizes(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _sizes(v)) for k, v in value.items())
    return None  # floats and the rest: values, not work


class TorchWork(TorchFunctionMode):
    """Records every torch function and tensor method a job calls, with its sizes."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self.events = events

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        self.events.append(("torch", name, _sizes(args), _sizes(kwargs or {}), _sizes(out)))
        return out


@dataclass
class Trace:
    """Everything a job's observer could see besides the rows, in order."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "trace"

    def __call__(
        self,
        values: torch.Tensor,
        *,
        sigma: float,
        sensitivity: float,
        error: float = 0.0,
        unit: float | None = None,
    ) -> torch.Tensor:
        self.events.append(("noise", tuple(values.shape), sigma, sensitivity, error))
        return values

    def report(self, done: float, total: float, phase: str) -> None:
        self.events.append(("report", done, total, phase))


def _parsed(X: np.ndarray, labels: np.ndarray) -> ParsedDataset:
    return unit_dataset(X, labels, K)


def neighbours() -> tuple[ParsedDataset, ParsedDataset]:
    """D and D′ differ in record 0 only: its features and its class (0 in D, 2 in D′), so
    class 0 has one record fewer in D′ and class 2 one more; every class keeps ≥ 15."""
    rng = np.random.default_rng(7)
    X = rng.uniform(0, 1, size=(N, D))
    labels = np.repeat(np.arange(K), N // K)
    X_prime, labels_prime = X.copy(), labels.copy()
    X_prime[0] = 1.0 - X[0]
    labels_prime[0] = 2
    return _parsed(X, labels), _parsed(X_prime, labels_prime)


class _Reached(Exception):
    """The traced job reached the phase the test stops at."""


def _trace(
    mechanism: str, params: dict[str, Any], data: ParsedDataset, until: str | None = None
) -> list[tuple[Any, ...]]:
    """The job's work, to its end or to its first report of phase ``until``."""
    trace = Trace()
    # The public facts, as the service knows them: never the private class counts.
    facts = facts_of(data, class_counts=None)
    two_scales = "sigma_y" in registry.accountant(mechanism, "tight").key_names
    noise = noise_for(mechanism, params, facts, sigma=0.7, sigma_y=0.7 if two_scales else None)

    def report(done: float, total: float, phase: str) -> None:
        trace.report(done, total, phase)
        if phase == until:
            raise _Reached

    with TorchWork(trace.events):
        try:
            out = build(
                mechanism,
                params,
                data,
                noise=noise,
                sampler=trace,
                generator=SecureRandom.from_seed(11),
                device=torch.device("cpu"),
                report=report,
            )
        except _Reached:
            return trace.events
        trace.events.append(("output", out.rows, out.progress, tuple(out.feature_names)))
        for x, y in out.chunks:
            trace.events.append(("chunk", tuple(x.shape), tuple(y.shape)))
    return trace.events


CASES = [
    pytest.param("dpmix", {"mixture_degree": 4, "n_samples": 300}, id="dpmix-mixture"),
    pytest.param(
        "dpmix",
        {"mixture_degree": 4, "n_samples": 300, "assignment": "record"},
        id="dpmix-record",
    ),
    pytest.param(
        "sgdrm",
        {"mixture_width": 4, "n_samples": 300, "coefficient_bound": 0.3},
        id="sgdrm-clipped",
    ),
    pytest.param(
        "sgdrm",
        {"mixture_width": 4, "n_samples": 300, "coefficients": "gaussian"},
        id="sgdrm-gaussian",
    ),
    pytest.param("local_perturbation", {}, id="local_perturbation"),
    pytest.param(
        "random_projection", {"projection_dim": 2, "spectral_norm": 1.5}, id="random_projection"
    ),
    pytest.param(
        "dpcda",
        {"mixture_degree": 4, "n_samples": 300, "min_class_size": 4, "class_sizes": "declared"},
        id="dpcda-declared",
    ),
    pytest.param(
        "dpcda",
        {
            "mixture_degree": 4,
            "n_samples": 300,
            "min_class_size": 4,
            "class_sizes": "dp",
            "count_noise": 0.5,
        },
        id="dpcda-dp-class-sizes",
    ),
    pytest.param(
        "dpcda",
        {"mixture_degree": 4, "n_samples": 300, "min_class_size": 4},
        id="dpcda-default",
    ),
    # Two clusters per class: the split, the assignment and the noisy statistics. (The trace
    # sampler adds no noise, so which clusters survive follows the exact counts here; every
    # cluster keeps members in both neighbours. In a release survival reads noisy counts.)
    pytest.param("clustmix", {"clusters_per_class": 2, "kmeans_refine": 1}, id="clustmix"),
    # DP-SGD on one network per class, and on two per class after DP kernel k-means: every
    # step lays the batch out in as many blocks whatever the clusters' counts (no work sized
    # by a cluster).
    pytest.param("dpgm", {"epochs": 2, "batch_size": 20}, id="dpgm-vae"),
    pytest.param(
        "dpgm",
        {"epochs": 1, "batch_size": 20, "clusters_per_class": 2, "kmeans_refine": 1},
        id="dpgm-vae-kmeans",
    ),
]

# The RBM samples network by network, as many rows each as its noisy size asks (public; the
# trace sampler adds no noise, so here they are exact counts): its training is compared.
SAMPLED_BY_NOISY_SIZES = [
    pytest.param("dpgm", {"epochs": 1, "batch_size": 20, "model": "rbm"}, id="dpgm-rbm"),
    # ClustMix model gaussian draws each cluster's rows by its noisy count: its noisy steps
    # (k-means, then the moments) are compared.
    pytest.param(
        "clustmix",
        {"model": "gaussian", "clusters_per_class": 2, "kmeans_refine": 1},
        id="clustmix-gaussian",
    ),
]


@pytest.mark.parametrize(("mechanism", "params"), SAMPLED_BY_NOISY_SIZES)
def test_same_training_work_on_neighbouring_datasets(
    mechanism: str, params: dict[str, Any]
) -> None:
    data, data_prime = neighbours()

    def training(trace: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        end = next(i for i, e in enumerate(trace) if e[0] == "report" and e[3] == "sampling")
        return trace[:end]

    trace = training(_trace(mechanism, params, data))
    assert sum(event[0] == "noise" for event in trace) > 2  # DP-SGD ran
    assert trace == training(_trace(mechanism, params, data_prime))


def test_mst_measures_its_one_way_marginals_alike_on_neighbours() -> None:
    """MST's work after its one-way histograms follows their noisy values (the compression's
    merged sizes, the selected pairs): a function of released noise, not of the records (the
    trace sampler adds none, so there it reads exact counts). Up to the selection the work is
    public; the selection reads a fixed batch of words per round (``test_mst``)."""
    data, data_prime = neighbours()

    def measuring(trace: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        end = next(i for i, e in enumerate(trace) if e[0] == "report" and e[3] == "selecting")
        return trace[:end]

    params = {"bins": 4, "iterations": 5}
    trace = measuring(_trace("mst", params, data, until="selecting"))
    assert sum(event[0] == "noise" for event in trace) == D + 1  # every attribute measured
    assert trace == measuring(_trace("mst", params, data_prime, until="selecting"))


def test_aim_measures_its_one_way_marginals_alike_on_neighbours() -> None:
    """AIM's rounds follow released values (the selections, the noisy marginals and the
    model fitted to them); up to them its work is public."""
    data, data_prime = neighbours()

    def measuring(trace: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        end = next(i for i, e in enumerate(trace) if e[0] == "report" and e[3] == "rounds")
        return trace[:end]

    params = {"bins": 4, "iterations": 5, "rounds": 16 * (D + 1)}
    trace = measuring(_trace("aim", params, data, until="rounds"))
    assert sum(event[0] == "noise" for event in trace) == D + 1  # every attribute measured
    assert trace == measuring(_trace("aim", params, data_prime, until="rounds"))


def test_every_served_mechanism_is_traced() -> None:
    """A mechanism added to the registry must join this test."""
    traced = {p.values[0] for p in CASES} | {"mst", "aim"}
    assert {spec.name for spec in registry.served()} <= traced


@pytest.mark.parametrize(("mechanism", "params"), CASES)
def test_same_work_on_neighbouring_datasets(mechanism: str, params: dict[str, Any]) -> None:
    data, data_prime = neighbours()
    assert np.bincount(data.labels).tolist() != np.bincount(data_prime.labels).tolist()
    # A first run warms lazy state (caches, torch's first-use set-up) that would otherwise
    # appear in whichever trace runs first, whatever the data: both traces start warm.
    _trace(mechanism, params, data_prime)
    trace = _trace(mechanism, params, data)
    assert any(event[0] == "chunk" for event in trace)  # the job ran
    assert trace == _trace(mechanism, params, data_prime)


def test_the_trace_sees_work_sized_by_a_class() -> None:
    """The comparison catches what it is for: a gather of one class's records, whose size is
    a private count, differs between the neighbours though every output shape is public."""
    data, data_prime = neighbours()

    def class_means(data: ParsedDataset) -> list[tuple[Any, ...]]:
        events: list[tuple[Any, ...]] = []
        features, labels = torch.as_tensor(data.X), torch.as_tensor(data.labels)
        with TorchWork(events):
            for c in range(K):
                features[torch.nonzero(labels == c).flatten()].mean(dim=0)
        return events

    assert class_means(data) != class_means(data_prime)


def test_release_files_take_label_names_from_declared_classes_only() -> None:
    """The worker's one source of label names: the declaration (absent classes included);
    labels merely found in a file are refused."""
    content = b"f0,label\n0.1,a\n0.2,HIV-positive\n0.3,a\n"
    meta = {"name": "t", "label_column": "label", "feature_range": [0, 1]}
    meta["budget"] = {"epsilon": 1.0, "delta": 1e-5}

    def parsed(**extra: Any) -> ParsedDataset:
        metadata = DatasetMetadata.model_validate({**meta, **extra})
        return parse_dataset(content=content, filename="d.csv", metadata=metadata, max_bytes=1000)

    with pytest.raises(ClassesUndeclared):
        published_classes(parsed())
    declared = ["a", "HIV-positive", "b"]
    assert published_classes(parsed(classes=declared)) == declared
