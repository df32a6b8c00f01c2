"""The registry and the spec contract: a mechanism is defined once, and nothing it declares can
be silently dropped or bypassed on its way to an accountant or to the noise sampler."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

from dpcore.accounting.accountant import Accountant, Key, N
from dpcore.accounting.events import NoiseDescription, NoiseScale
from dpcore.mechanisms import registry
from dpcore.mechanisms.noise import DeclaredNoise, FastNoise, UndeclaredNoise
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.mechanisms.spec import (
    Accounting,
    Guidance,
    InvalidParams,
    MechanismSpec,
    PublicFacts,
    SpecError,
)
from tests import toy_mechanism as toy

ROOT = Path(__file__).resolve().parents[2]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1, description="rows")
    mode: str = Field(default="a", description="a mode")


def _spec(**changes: Any) -> MechanismSpec:
    """A made-up spec; ``changes`` name fields of the spec or of its groups."""
    accountant = Accountant(
        mechanism="made_up",
        name="tight",
        summary="",
        keys=(N, Key.of(_Params, "rows")),
        build=lambda sigma, keys: None,  # type: ignore[arg-type,return-value]
    )
    base = MechanismSpec(
        name="made_up",
        params=_Params,
        label_kind="proportions",
        accounting=Accounting(accountants=(accountant,), release_only=frozenset({"mode"})),
        guidance=Guidance(summary="", output=""),
    )
    groups = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    for group, value in list(groups.items()):
        if dataclasses.is_dataclass(value):
            mine = {k: changes.pop(k) for k in list(changes) if hasattr(value, k)}
            groups[group] = dataclasses.replace(value, **mine)  # type: ignore[type-var]
    return dataclasses.replace(base, **{**groups, **changes})


def test_every_builtin_spec_is_consistent() -> None:
    for spec in registry.specs():
        spec.validate()
        assert spec.name in registry.BUILTIN or spec.name == toy.NAME
        for accountant in spec.accounting.accountants:
            assert registry.accountant(spec.name, accountant.name) is accountant
    # Built-ins first, in the import list's order (the CLI's default is the first).
    assert registry.names()[: len(registry.BUILTIN)] == list(registry.BUILTIN)


def test_every_served_mechanism_names_its_essential_parameters() -> None:
    """Forms show them first (the rest as advanced): a few, each one of its parameters."""
    for spec in registry.served():
        essentials = spec.guidance.essentials
        assert 1 <= len(essentials) <= 4, spec.name
        assert set(essentials) <= set(spec.params.model_fields), spec.name
    with pytest.raises(SpecError, match=r"essentials \['bins'\] are not parameters"):
        _spec(essentials=("rows", "bins")).validate()


def test_a_parameter_that_reaches_no_accountant_is_refused_at_registration() -> None:
    with pytest.raises(SpecError, match=r"\['mode'\] reach neither"):
        registry.register(_spec(release_only=frozenset()))
    assert "made_up" not in registry.names()


def test_a_value_the_accountant_does_not_analyse_is_refused() -> None:
    spec = _spec(release_only=frozenset())
    accountant = dataclasses.replace(spec.accounting.accountants[0], assumes={"mode": "a"})
    spec = _spec(release_only=frozenset(), accountants=(accountant,))
    spec.validate()
    facts = PublicFacts(n=10, n_features=2, n_classes=2)
    keys = spec.accountant_keys(accountant, _Params(rows=3), facts)
    assert keys == {"n": 10, "rows": 3}  # facts offered, the declared one taken
    with pytest.raises(InvalidParams, match="analyses mode='a' only"):
        spec.accountant_keys(accountant, _Params(rows=3, mode="b"), facts)
    with pytest.raises(InvalidParams, match="does not apply"):
        spec.accountant_keys(accountant, _Params(rows=3), facts, {"sigma_y": 1.0})


def test_a_spec_names_one_of_the_two_worker_queues() -> None:
    assert _spec().execution.queue == "cpu"  # the default: CPU workers run it
    _spec(queue="gpu").validate()
    # A spec from a plugin escapes mypy's Literal: registration refuses an unknown pool.
    with pytest.raises(SpecError, match="queue 'tpu' is not one of"):
        registry.register(_spec(queue="tpu"))
    assert "made_up" not in registry.names()


def test_registration_refuses_duplicates_and_foreign_accountants() -> None:
    with pytest.raises(SpecError, match="already registered"):
        registry.register(dataclasses.replace(registry.get("dpmix")))
    foreign = _spec(accountants=(registry.accountant("dpmix", "tight"),), default="tight")
    with pytest.raises(SpecError, match="dpmix's"):
        registry.register(foreign)


def test_keys_come_from_the_one_parameter_definition() -> None:
    key = Key.of(_Params, "rows")
    assert (key.kind, key.required, key.minimum, key.help) == (int, True, 1.0, "rows")
    with pytest.raises(ValueError, match="rows must be >= 1"):
        key.parse("0")
    audit = Key.of(_Params, "rows", default=4)
    assert (audit.required, audit.default) == (False, 4)
    mode = Key.of(_Params, "mode")
    assert (mode.kind, mode.default) == (str, "a")


def test_the_sampler_adds_only_declared_noise() -> None:
    declared = NoiseDescription(
        scales=(
            NoiseScale("features", 0.5, 0.25, ("features",)),
            NoiseScale("labels", 2.0, 0.25, ("labels",)),
        ),
        calibrated="features",
    )
    calls: list[tuple[float, float]] = []

    class Recorder:
        name = "recorder"

        def __call__(
            self,
            values: torch.Tensor,
            *,
            sigma: float,
            sensitivity: float,
            error: float = 0.0,
            unit: float | None = None,
        ) -> torch.Tensor:
            calls.append((sigma, sensitivity))
            return values

    guard = DeclaredNoise(Recorder(), declared)
    values = torch.zeros(3, 2)
    guard(values, sigma=0.5, sensitivity=0.2)  # less than declared: planned at the declared one
    guard(values, sigma=2.0, sensitivity=0.25)
    assert calls == [(0.5, 0.25), (2.0, 0.25)]
    with pytest.raises(UndeclaredNoise, match="not declared"):
        guard(values, sigma=0.25, sensitivity=0.25)  # a σ nobody charged
    with pytest.raises(UndeclaredNoise):
        guard(values, sigma=0.5, sensitivity=0.5)  # more sensitivity than accounted
    assert guard.name == "recorder"
    assert isinstance(
        DeclaredNoise(FastNoise(SecureRandom()), declared)(values, sigma=0.5, sensitivity=0.25),
        torch.Tensor,
    )


def test_noise_descriptions_survive_json() -> None:
    event = registry.accountant("sgdrm", "tight").at_sigma(
        0.3, {"n": 100, "mixture_width": 4, "n_samples": 10}
    )
    described = event.noise()
    again = NoiseDescription.from_json(json.loads(json.dumps(described.to_json())))
    assert again == described
    assert again.analysis == {"coefficient_bound": 1.5}
    with pytest.raises(ValueError, match="unique"):
        NoiseDescription(scales=(described.scales[0],) * 2, calibrated="mixtures")
    with pytest.raises(ValueError, match="calibrated"):
        NoiseDescription(scales=described.scales, calibrated="nothing")


def test_a_mechanism_module_joins_through_the_environment() -> None:
    """A third-party mechanism: a module exposing SPEC, named in DPRELEASE_MECHANISM_MODULES."""
    env = {**os.environ, registry.MODULES_ENV: "tests.toy_mechanism", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dpcore.mechanisms import registry; print(registry.names())",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert toy.NAME in out.stdout


def test_admission_names_the_servers_row_limit(tmp_path: Path) -> None:
    from service.config import Settings
    from service.models import Dataset
    from service.releases.mechanisms import facts

    dataset = Dataset(
        n_rows=50, n_features=3, classes=[0, 1], feature_shape=[3], class_counts=[25, 25]
    )
    known = facts(dataset, Settings(home=tmp_path, max_release_samples=100))  # type: ignore[call-arg]
    dpmix = registry.get("dpmix")
    dpmix.check(dpmix.params(mixture_degree=2, n_samples=100), known)
    message = r"n_samples 101 exceeds this server's limit 100 \(DPRELEASE_MAX_RELEASE_SAMPLES\)"
    with pytest.raises(InvalidParams, match=message):
        dpmix.check(dpmix.params(mixture_degree=2, n_samples=101), known)
    with pytest.raises(InvalidParams, match="exceeds the dataset's 50 rows"):
        dpmix.check(dpmix.params(mixture_degree=51, n_samples=1), known)
    # DP-CDA rounds T up to whole classes: 2·⌈99/2⌉ = 100 rows fit, 2·⌈101/2⌉ = 102 do not.
    dpcda = registry.get("dpcda")
    dpcda.check(dpcda.params(mixture_degree=2, n_samples=99, min_class_size=20), known)
    with pytest.raises(InvalidParams, match="n_samples 102 exceeds"):
        dpcda.check(dpcda.params(mixture_degree=2, n_samples=101, min_class_size=20), known)
    # The opt-in 'declared' class sizes check m against the private counts; the default
    # 'dp' reads none (m above a class is admitted: the DP lower bounds decide in the job).
    unbalanced = dataclasses.replace(known, class_counts=(20, 30))
    with pytest.raises(InvalidParams, match="not a lower bound"):
        dpcda.check(
            dpcda.params(mixture_degree=2, n_samples=10, min_class_size=21, class_sizes="declared"),
            unbalanced,
        )
    dpcda.check(
        dpcda.params(mixture_degree=2, n_samples=10, min_class_size=21, count_noise=1.0),
        unbalanced,
    )
    # Public figures: K·m > n holds on no dataset, whatever the mode.
    with pytest.raises(InvalidParams, match="no class split reaches it"):
        dpcda.check(
            dpcda.params(mixture_degree=2, n_samples=10, min_class_size=26, count_noise=1.0),
            known,
        )
