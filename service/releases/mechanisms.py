"""The mechanisms the service runs: their parameters, the checks against public facts, and
what `GET /mechanisms` says of them."""

from __future__ import annotations

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
            name="sgdrm",
            summary="SGD on random mixtures (Lee et al., ICLR 2018 WS): T noisy mixtures with "
            "random coefficients b·clip(g, −c, c), b ~ Bern(ℓ/n), g ~ N(0, 1/ℓ)",
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
