"""The mechanisms the service runs: their parameters, the checks against public facts, and
what `GET /mechanisms` says of them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dpcore.accounting import registry
from service.config import Settings
from service.errors import InvalidInput
from service.models import Dataset
from service.releases.schemas import (
    AccountantInfo,
    DPCDAParams,
    DPMixParams,
    LocalPerturbationParams,
    MechanismInfo,
    MechanismList,
    RandomProjectionParams,
    SGDRMParams,
)

Check = Callable[[Any, Dataset, Settings], None]


@dataclass(frozen=True)
class ServedMechanism:
    name: str
    summary: str
    output: str
    params: type[BaseModel]
    check: Check


def _check_dpmix(params: DPMixParams, dataset: Dataset, settings: Settings) -> None:
    if params.mixture_degree > dataset.n_rows:
        raise InvalidInput(
            f"mixture_degree {params.mixture_degree} exceeds the dataset's {dataset.n_rows} rows"
        )
    _check_rows(params.n_samples, settings)


def _check_rows(rows: int, settings: Settings) -> None:
    if rows > settings.max_release_samples:
        raise InvalidInput(
            f"n_samples {rows} exceeds this server's limit {settings.max_release_samples} "
            "(DPRELEASE_MAX_RELEASE_SAMPLES)"
        )


def _check_dpcda(params: DPCDAParams, dataset: Dataset, settings: Settings) -> None:
    if params.mixture_degree > params.min_class_size:
        raise InvalidInput(
            f"min_class_size {params.min_class_size} must be at least mixture_degree "
            f"{params.mixture_degree}"
        )
    if dataset.class_counts is None:
        raise InvalidInput("this dataset predates class counts; upload it again to use dpcda")
    # Only the owner can ask, so this check on private counts answers nobody else.
    if params.min_class_size > min(dataset.class_counts):
        raise InvalidInput(
            f"min_class_size {params.min_class_size} is not a lower bound of every class's "
            "size in this dataset; declare a smaller one"
        )
    for name in ("feature_mean", "feature_std"):
        values = getattr(params, name)
        if values is not None and len(values) != dataset.n_features:
            raise InvalidInput(f"{name} needs {dataset.n_features} values, got {len(values)}")
    k = len(dataset.classes)
    _check_rows(k * (-(-params.n_samples // k)), settings)


def _check_sgdrm(params: SGDRMParams, dataset: Dataset, settings: Settings) -> None:
    if params.mixture_width > dataset.n_rows:
        raise InvalidInput(
            f"mixture_width {params.mixture_width} exceeds the dataset's {dataset.n_rows} rows"
        )
    _check_rows(params.n_samples, settings)


def _check_local(_params: LocalPerturbationParams, dataset: Dataset, settings: Settings) -> None:
    _check_rows(dataset.n_rows, settings)


def _check_projection(params: RandomProjectionParams, dataset: Dataset, settings: Settings) -> None:
    if params.projection_dim > dataset.n_features:
        raise InvalidInput(
            f"projection_dim {params.projection_dim} exceeds the dataset's "
            f"{dataset.n_features} features"
        )
    _check_rows(dataset.n_rows, settings)


SERVED: dict[str, ServedMechanism] = {
    m.name: m
    for m in (
        ServedMechanism(
            name="dpmix",
            summary="Random mixing (Lee et al., ISIT 2019): T noisy means of ℓ records",
            output="X: n_samples × n_features noisy mixtures (preprocessed scale); "
            "y: n_samples × n_classes noisy mixed one-hot labels",
            params=DPMixParams,
            check=_check_dpmix,
        ),
        ServedMechanism(
            name="dpcda",
            summary="Class-centric mixing (DP-CDA): per class, noisy means of ℓ records of "
            "that class; class-balanced output, exact labels",
            output="X: K·⌈T/K⌉ × n_features noisy class mixtures (standardised, clipped "
            "scale); y: their one-hot classes (exact)",
            params=DPCDAParams,
            check=_check_dpcda,
        ),
        ServedMechanism(
            name="sgdrm",
            summary="SGD on random mixtures (Lee et al., ICLR 2018 WS): T noisy mixtures with "
            "random coefficients b·clip(g, −c, c) (or the paper's unclipped b·g), "
            "b ~ Bern(ℓ/n), g ~ N(0, 1/ℓ)",
            output="X: n_samples × n_features noisy random combinations (preprocessed scale); "
            "y: the same combinations of one-hot labels, noisy; learn with "
            "dpcore.learning.bias_corrected_sgd",
            params=SGDRMParams,
            check=_check_sgdrm,
        ),
        ServedMechanism(
            name="local_perturbation",
            summary="Baseline: every record once, with Gaussian noise (DPMix paper, Sec. IV)",
            output="X: n × n_features noisy records (preprocessed scale); y: n × n_classes "
            "noisy one-hot labels",
            params=LocalPerturbationParams,
            check=_check_local,
        ),
        ServedMechanism(
            name="random_projection",
            summary="Baseline: every record projected by a data-independent Gaussian matrix "
            "then noised (DPMix paper, Sec. IV)",
            output="X: n × projection_dim noisy projections; y: n × n_classes noisy one-hot "
            "labels; NPZ also holds the projection matrix",
            params=RandomProjectionParams,
            check=_check_projection,
        ),
    )
}


def catalogue() -> MechanismList:
    items = []
    for mechanism in SERVED.values():
        accountants = [
            AccountantInfo(
                name=acc.name,
                summary=acc.summary,
                valid_bound=acc.valid_bound,
                caveat=acc.caveat or None,
            )
            for acc in registry.all_accountants()
            if acc.mechanism == mechanism.name
        ]
        items.append(
            MechanismInfo(
                name=mechanism.name,
                summary=mechanism.summary,
                output=mechanism.output,
                params_schema=mechanism.params.model_json_schema(),
                accountants=accountants,
            )
        )
    return MechanismList(items=items)


def stats_mu(*, n_features: int, stats_noise: float) -> float:
    """μ of DP standardisation statistics: replace-one moves the sum vector and the sum-of-
    squares vector of [0, 1]-scaled features by at most √d each."""
    return math.sqrt(2 * n_features) / stats_noise


def extra_accountant_keys(mechanism: str, params: Any, dataset: Dataset) -> dict[str, Any]:
    if mechanism == "dpcda" and params.standardization == "dp":
        return {"stats_mu": stats_mu(n_features=dataset.n_features, stats_noise=params.stats_noise)}
    return {}
