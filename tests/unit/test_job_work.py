"""Job time bounded at admission (issue 35, item 4): every served mechanism declares its work
from public figures, every default on MNIST and on tables stays under the service's default
cap, and DPGM at 1000 epochs with 4096 hidden units on MNIST's 10 000 rows (about a day of
training) is refused, naming the estimate and the limit."""

from __future__ import annotations

import pytest

from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import InvalidParams, JobOverWorkCap, MechanismSpec, PublicFacts
from service.config import Settings

CAP = Settings.model_fields["max_job_work"].default


def _facts(**overrides: object) -> PublicFacts:
    values: dict[str, object] = {
        "n": 10_000,
        "n_features": 784,
        "n_classes": 10,
        "feature_shape": (28, 28),
        "class_counts": (1000,) * 10,
        "max_job_work": CAP,
    }
    values.update(overrides)
    return PublicFacts(**values)  # type: ignore[arg-type]


SHAPES = {
    "mnist-10k": _facts(),
    "mnist-60k": _facts(n=60_000, class_counts=(6000,) * 10),
    "adult": _facts(
        n=48_842,
        n_features=104,
        n_classes=2,
        feature_shape=(),
        n_columns=14,
        class_counts=(37_000, 11_842),
    ),
    "narrow-1M": _facts(
        n=1_000_000,
        n_features=8,
        n_classes=2,
        feature_shape=(),
        n_columns=8,
        class_counts=(500_000, 500_000),
    ),
}

SERVED = registry.served()


def _plan(spec: MechanismSpec, params: dict[str, object], facts: PublicFacts) -> None:
    spec.check(spec.resolve(spec.request_params.model_validate(params), facts), facts)


@pytest.mark.parametrize("spec", SERVED, ids=lambda s: s.name)
def test_every_served_mechanism_declares_its_work(spec: MechanismSpec) -> None:
    assert spec.admission.work is not None, spec.name


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("spec", SERVED, ids=lambda s: s.name)
def test_defaults_stay_under_the_default_cap(spec: MechanismSpec, shape: str) -> None:
    facts = SHAPES[shape]
    params = spec.resolve(spec.request_params.model_validate({}), facts)
    if spec.admission.check is not None:
        try:
            spec.admission.check(params, facts)
        except InvalidParams:
            pytest.skip(f"{spec.name} refuses this shape outright (its own check)")
    assert spec.admission.work is not None
    estimate = spec.admission.work(params, facts)
    # A margin: a default is far from the cap, not just under it.
    assert 0 < estimate < CAP / 10, (spec.name, shape, estimate)


def test_a_day_of_dpgm_training_is_refused_naming_estimate_and_limit() -> None:
    spec = registry.get("dpgm")
    with pytest.raises(JobOverWorkCap) as refused:
        _plan(spec, {"epochs": 1000, "hidden": 4096}, _facts(work_hint="the test's limit"))
    assert refused.value.estimate > refused.value.limit == CAP
    message = str(refused.value)
    assert f"{refused.value.estimate:.3g}" in message and "the test's limit" in message
    # Without a cap (dprelease account, the benches) the same request passes admission.
    _plan(spec, {"epochs": 1000, "hidden": 4096}, _facts(max_job_work=None))
