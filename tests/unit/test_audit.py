"""Empirical privacy audits (dpcore.audit, `dprelease audit`).

Every audit runs the real dpcore mechanism functions on worst-case neighbours with a fixed seed.
The same configurations are audited as shipped (the lower bound must stay below the claim, and
be non-trivial, so the audit has power) and with planted bugs injected through the harness's
test seams (`preprocess`, `wrap`): each bug must push the lower bound above the claim.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from scipy.stats import beta

from dpcore.audit import releases, run_audit, stats
from dpcore.audit.case import Neighbours
from dpcore.audit.harness import audited
from dpcore.mechanisms import registry, sampling
from dpcore.mechanisms.dpgm import dpsgd
from dpcore.mechanisms.dpmix import generate as dpmix_module
from dpcore.mechanisms.noise import FastNoise
from dpcore.mechanisms.run import build, facts_of, noise_for
from dpcore.mechanisms.secure_random import SecureRandom
from dpcore.preprocessing import scale_to_unit, standardise
from dprelease_cli.main import cli
from service.datasets.parsing import ParsedDataset

DELTA = 1e-2
TRIALS = 40_000

# name: (mechanism, params, claim). The claim is an ε to calibrate for, or the noise σ where
# calibration is slow (sgdrm's PLD: σ = 0.1475 claims ε ≈ 2.0).
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "local_perturbation": ("local_perturbation", {}, {"epsilon": 2.0}),
    "random_projection": ("random_projection", {}, {"epsilon": 2.0}),
    "dpmix": ("dpmix", {}, {"epsilon": 2.0}),
    # Noisier labels: the features carry most of the signal, so a feature bug shows clearly.
    "local_perturbation_r4": ("local_perturbation", {"noise_ratio": 4}, {"epsilon": 2.0}),
    "dpmix_r4": ("dpmix", {"noise_ratio": 4}, {"epsilon": 2.0}),
    "dpmix_subsampled": ("dpmix", {"n": 8, "mixture_degree": 1}, {"epsilon": 1.0}),
    "dpmix_record": ("dpmix", {"assignment": "record"}, {"epsilon": 2.0}),
    "dpcda": ("dpcda", {}, {"epsilon": 2.0}),
    "dpcda_declared": ("dpcda", {"standardization": "declared"}, {"epsilon": 2.0}),
    "sgdrm": ("sgdrm", {}, {"sigma": 0.1475}),
    # One noisy step (cluster sums and counts) with record 0 moving between clusters.
    "clustmix": ("clustmix", {}, {"epsilon": 2.0}),
    "clustmix_half_counts": ("clustmix", {"count_share": 0.5}, {"epsilon": 2.0}),
    # Model gaussian's step: the sums, second-moment sums and counts of the two clusters.
    "clustmix_gaussian": ("clustmix", {"model": "gaussian"}, {"epsilon": 2.0}),
    # Most of the step's μ² on the second moments: a bug there shows most.
    "clustmix_gaussian_second": (
        "clustmix",
        {"model": "gaussian", "moment_share": 0.8},
        {"epsilon": 2.0},
    ),
    # One DP-SGD step with record 0's clipped gradient flipping sign (q = 1, then q = 1/2).
    "dpgm": ("dpgm", {}, {"epsilon": 2.0}),
    "dpgm_subsampled": ("dpgm", {"n": 8, "batch_size": 4}, {"epsilon": 2.0}),
}
# Measured bounds are well above these floors: an audit that fell below one lost its power.
POWER_FLOOR = {
    "local_perturbation": 1.2,
    "local_perturbation_r4": 1.2,
    "dpmix_r4": 0.8,
    "random_projection": 0.8,
    "dpmix": 0.8,
    "dpmix_subsampled": 0.1,
    "dpmix_record": 0.6,
    "dpcda": 0.8,
    "dpcda_declared": 0.8,
    "sgdrm": 0.3,
    "clustmix": 1.2,
    "clustmix_half_counts": 1.2,
    "clustmix_gaussian": 1.2,
    "clustmix_gaussian_second": 1.2,
    "dpgm": 1.0,
    "dpgm_subsampled": 1.0,
}
# The record assignment runs once per trial (its mixtures are coupled): fewer trials. DPGM's
# step runs once per trial too (about 0.4 ms a step).
CASE_TRIALS = {"dpmix_record": 6_000, "dpgm": 20_000, "dpgm_subsampled": 20_000}
# A planted bug in DPGM's step lifts the bound about twice above the claim: fewer trials (a
# looser Clopper–Pearson bound, so a stricter test) still catch it.
BUG_TRIALS = {"dpgm": 6_000, "dpgm_subsampled": 6_000}


def _audit(case: str, trials: int | None = None, **hooks: Any) -> dict[str, Any]:
    mechanism, params, claim = CASES[case]
    return run_audit(
        mechanism,
        params,
        delta=DELTA,
        trials=trials or CASE_TRIALS.get(case, TRIALS),
        seed=0,
        **claim,
        **hooks,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_shipped_mechanisms_stay_below_their_claim(case: str) -> None:
    result = _audit(case)
    assert result["epsilon_lower_bound"] < result["epsilon_claimed"]
    assert result["epsilon_lower_bound"] > POWER_FLOOR[case]
    assert result["confidence"] == 0.95 and result["delta"] == DELTA


# --- planted bugs, through the harness's seams (never a copy of the mechanism) ---------------


def _half_noise(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v / 2 if k.startswith("sigma") else v for k, v in kwargs.items()})

    return wrapped


def _always_record_zero(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every mixture holds record 0 (the sampler is biased; the accountant assumes ℓ/n)."""
    real = sampling.uniform_subsets

    def biased(n: int, size: int, count: int, **kwargs: Any) -> torch.Tensor:
        idx = real(n, size, count, **kwargs)
        idx[~(idx == 0).any(dim=1), 0] = 0
        return idx

    def wrapped(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with mock.patch.object(dpmix_module, "uniform_subsets", biased):
            yield from fn(*args, **kwargs)

    return wrapped


def _no_norm_scaling(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    """[0, 1] scaling without the L2 row scaling: the canary rows have norm 2."""
    return scale_to_unit(X, nb.lo, nb.hi)


def _no_clipping(X: np.ndarray, nb: Neighbours) -> np.ndarray:
    """dpcda's declared standardisation with clip_norm ignored: norm 2 instead of C = 1."""
    assert nb.feature_mean is not None and nb.feature_std is not None
    return standardise(np.clip(X, nb.lo, nb.hi), nb.feature_mean, nb.feature_std)


def _one_row_per_record(fn: Callable[..., Any]) -> Callable[..., Any]:
    """ClustMix calibrated as if a replaced record moved one cluster's sum only (sensitivity
    √2, counts unmoved): μ² = 2/σ_s², where a record moving between clusters moves two sums and
    two counts. With count_share ½ both noises come out √2 too small."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        scale = math.sqrt(0.5)
        kwargs["sigma_sums"] *= scale
        kwargs["sigma_counts"] *= scale
        return fn(*args, **kwargs)

    return wrapped


def _half_second_noise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """ClustMix gaussian's second-moment sums noised at half the charged scale."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        scales = kwargs["scales"]
        kwargs["scales"] = dataclasses.replace(scales, second=scales.second / 2)
        return fn(*args, **kwargs)

    return wrapped


def _second_sensitivity_low(fn: Callable[..., Any]) -> Callable[..., Any]:
    """ClustMix gaussian calibrated as if a second-moment block moved by 1/√2 of what it does
    (‖z zᵀ‖_F taken as ‖z‖²/√2): its noise √2 too small."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        scales = kwargs["scales"]
        kwargs["scales"] = dataclasses.replace(scales, second=scales.second / math.sqrt(2))
        return fn(*args, **kwargs)

    return wrapped


def _half_step_noise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """DPGM's step with both its noises (gradients, norm histogram) at half the scale."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        args = tuple(
            dataclasses.replace(a, sigma=a.sigma / 2, sigma_norm=a.sigma_norm / 2)
            if isinstance(a, dpsgd.SGDSettings)
            else a
            for a in args
        )
        return fn(*args, **kwargs)

    return wrapped


def _unclipped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A network family whose clipped sum ignores the clip factors (every gradient summed
    whole): record 0's gradient, of norm 2·C_max, enters at ≥ twice the sensitivity."""

    @dataclasses.dataclass(frozen=True)
    class Unclipped:
        net: Any

        def names(self) -> tuple[str, ...]:
            names: tuple[str, ...] = self.net.names()
            return names

        def gradients(self, *args: Any) -> tuple[torch.Tensor, Callable[..., Any]]:
            norms, clip_sum = self.net.gradients(*args)
            return norms, lambda factors: clip_sum(torch.ones_like(factors))

    def wrapped(net: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(Unclipped(net), *args, **kwargs)

    return wrapped


BUGS: list[tuple[str, dict[str, Any]]] = [
    ("local_perturbation", {"wrap": _half_noise}),
    ("dpmix", {"wrap": _half_noise}),
    ("dpcda", {"wrap": _half_noise}),
    ("sgdrm", {"wrap": _half_noise}),
    ("local_perturbation_r4", {"preprocess": _no_norm_scaling}),
    ("dpmix_r4", {"preprocess": _no_norm_scaling}),
    ("dpcda", {"preprocess": _no_norm_scaling}),
    ("dpcda_declared", {"preprocess": _no_clipping}),
    ("dpmix_subsampled", {"wrap": _always_record_zero}),
    ("clustmix", {"wrap": _half_noise}),
    ("clustmix_half_counts", {"wrap": _one_row_per_record}),
    ("clustmix_gaussian", {"wrap": _half_second_noise}),
    ("clustmix_gaussian_second", {"wrap": _second_sensitivity_low}),
    ("dpgm", {"wrap": _half_step_noise}),
    ("dpgm_subsampled", {"wrap": _unclipped}),
]


@pytest.mark.parametrize(
    ("case", "hooks"),
    BUGS,
    ids=[f"{case}-{next(iter(hooks.values())).__name__.strip('_')}" for case, hooks in BUGS],
)
def test_planted_bugs_push_the_bound_above_the_claim(case: str, hooks: dict[str, Any]) -> None:
    result = _audit(case, BUG_TRIALS.get(case), **hooks)
    assert result["epsilon_lower_bound"] > result["epsilon_claimed"], result


# --- the secure sampler (the release default; OS CSPRNG, so not seeded) ----------------------


@pytest.mark.parametrize("case", ["local_perturbation", "dpmix"])
def test_secure_sampler_stays_below_the_claim_and_keeps_the_power(case: str) -> None:
    result = _audit(case, noise_sampler="secure")
    assert result["noise"]["sampler"] == "secure"
    assert POWER_FLOOR[case] < result["epsilon_lower_bound"] < result["epsilon_claimed"]


def test_secure_sampler_with_half_the_noise_is_caught() -> None:
    result = _audit("local_perturbation", wrap=_half_noise, noise_sampler="secure")
    assert result["epsilon_lower_bound"] > result["epsilon_claimed"], result


# --- the audit runs what the worker runs ------------------------------------------------------


def _parsed(nb: Neighbours, X: np.ndarray, labels: np.ndarray) -> ParsedDataset:
    return ParsedDataset(
        X=X,
        feature_shape=(X.shape[1],),
        feature_names=[str(i) for i in range(X.shape[1])],
        labels=labels,
        classes=list(range(nb.n_classes)),
        classes_declared=True,
        lo=nb.lo,
        hi=nb.hi,
        clipped_values=0,
    )


def _worker_params(mechanism: str, p: dict[str, Any], nb: Neighbours) -> dict[str, Any]:
    fields = registry.get(mechanism).params.model_fields
    params = {k: v for k, v in p.items() if k in fields}
    if mechanism != "dpcda":
        return params
    # The audit's claim: one class of n records, declared (its size n is public).
    params["class_sizes"] = "declared"
    if nb.feature_mean is None:  # unit_range: no statistics
        return {**params, "standardization": "unit_range", "min_class_size": p["n"]}
    assert nb.feature_std is not None
    return {
        **params,
        "standardization": "declared",
        "feature_mean": nb.feature_mean.tolist(),
        "feature_std": nb.feature_std.tolist(),
        "min_class_size": p["n"],
    }


# ClustMix's and DPGM's audits run one step of their release
# (test_clustmix_audit_runs_the_release_step, test_dpgm_audit_runs_the_training_step).
@pytest.mark.parametrize(
    "case", sorted(c for c in CASES if CASES[c][0] not in ("clustmix", "dpgm"))
)
def test_one_audit_trial_is_the_workers_release(case: str) -> None:
    mechanism, params, _ = CASES[case]
    sigma_y = 0.0 if mechanism == "dpcda" else 0.3
    sigma_x = sigma_y if mechanism == "sgdrm" else 0.2
    from dpcore.audit import parse_params

    p = parse_params(mechanism, params)
    release, release_prime, nb = releases(
        mechanism, p, sigma_x=sigma_x, sigma_y=sigma_y, trials=1, seed=7
    )
    stacked = mechanism in ("local_perturbation", "random_projection")
    # The baselines release D and D′ stacked in one call (one dataset, one projection).
    X = np.vstack([nb.X, nb.X_prime]) if stacked else nb.X
    labels = np.concatenate([nb.labels, nb.labels_prime]) if stacked else nb.labels
    generator = SecureRandom.from_seed(7)
    params = _worker_params(mechanism, p, nb)
    data = _parsed(nb, X, labels)
    noise = noise_for(
        mechanism,
        params,
        facts_of(data),
        sigma=sigma_x,
        sigma_y=sigma_y if mechanism not in ("dpcda", "sgdrm") else None,
    )
    out = build(
        mechanism,
        params,
        data,
        noise=noise,
        sampler=FastNoise(generator),
        generator=generator,
        device=torch.device("cpu"),
    )
    rows = torch.cat([x for x, _ in out.chunks])
    n = nb.X.shape[0]
    assert torch.equal(rows[:n] if stacked else rows, release.features[0])
    if stacked:
        assert torch.equal(rows[n:], release_prime.features[0])
    if mechanism == "random_projection":
        assert release.projection is not None
        assert np.array_equal(out.extra["projection"], release.projection.numpy())


def test_clustmix_gaussian_audit_runs_the_release_step() -> None:
    """Model gaussian's audit runs ``moments.noisy_moments``, the function the release's final
    step calls, and its projection is exact on both canaries."""
    from dpcore.audit.case import unit_neighbours, unit_preprocess
    from dpcore.mechanisms import moments
    from dpcore.mechanisms.clustmix import audit as clustmix_audit
    from dpcore.mechanisms.clustmix import release as clustmix_release

    p = {"model": "gaussian", "count_share": 0.1, "moment_share": 0.5, "n": 4}
    assert clustmix_audit.case().function(p) is moments.noisy_moments
    assert clustmix_release.moments.noisy_moments is moments.noisy_moments
    P = clustmix_audit.gaussian_projection(p)
    nb = unit_neighbours(p)
    ratio = clustmix_audit.second_ratio(p)
    for X, block in ((nb.X, 0), (nb.X_prime, 1)):
        z = torch.as_tensor(unit_preprocess(X[:1], nb)[0], dtype=torch.float64)
        image = P @ z
        d, w = 8, 36
        assert torch.allclose(image[block * d : (block + 1) * d], z)
        second = image[2 * d + block * w : 2 * d + (block + 1) * w] * ratio
        assert torch.allclose(second, moments.triangle(z[:, None] * z[None, :]))
        assert float(image.norm() ** 2) == pytest.approx(1 + 1 / ratio**2)


def test_clustmix_audit_runs_the_release_step() -> None:
    """The function the ClustMix audit runs is the one every step of its release calls, with
    the accountant's two scales, and one audit trial is that step on the neighbours."""
    from dpcore.mechanisms import kmeans
    from dpcore.mechanisms.clustmix import audit as clustmix_audit
    from dpcore.mechanisms.clustmix import release as clustmix_release

    assert clustmix_audit.case().function({}) is kmeans.noisy_statistics
    # Every step of the release (k-means and final) is kmeans.step, which noises through it.
    assert clustmix_release.step is kmeans.step
    with mock.patch.object(kmeans, "noisy_statistics", wraps=kmeans.noisy_statistics) as seen:
        centres = kmeans.Centres(torch.zeros((1, 2), dtype=torch.float64), torch.tensor([0]))
        kmeans.step(
            torch.ones((3, 2), dtype=torch.float64),
            torch.zeros(3, dtype=torch.int64),
            centres,
            kmeans.StepNoise(0.2, 0.7),
            FastNoise(SecureRandom.from_seed(1)),
            error=0.0,
            chunk=2,
        )
    assert seen.call_count == 1
    assert (seen.call_args.kwargs["sigma_sums"], seen.call_args.kwargs["sigma_counts"]) == (
        0.2,
        0.7,
    )
    calls: list[dict[str, Any]] = []

    def spy(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return fn(*args, **kwargs)

        return wrapped

    release, _, _ = releases(
        "clustmix", {"n": 3}, sigma_x=0.2, sigma_y=0.7, trials=2, seed=3, wrap=spy
    )
    # One call of the step per dataset, every trial's clusters in it.
    assert [(c["sigma_sums"], c["sigma_counts"]) for c in calls] == [(0.2, 0.7)] * 2
    assert release.features.shape == (2, 1, 16) and release.labels is not None
    assert release.labels.shape == (2, 1, 3)


def test_dpgm_audit_runs_the_training_step() -> None:
    """The function the DPGM audit runs is the step ``dpsgd.train`` takes, at the release's
    scales and DPNorm settings, and one audit trial is the first step of ``train`` on D (same
    seed: the same Poisson batch, histogram noise and gradient noise)."""
    from dpcore.audit import parse_params
    from dpcore.mechanisms.dpgm import audit as dpgm_audit
    from dpcore.mechanisms.dpgm.params import DPGMParams

    assert dpgm_audit.case().function({}) is dpsgd.noisy_step
    calls: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    def spy(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            calls.append((args, kwargs, out))
            return out

        return wrapped

    p = parse_params("dpgm", {"n": 5, "batch_size": 2})
    release, release_prime, nb = releases(
        "dpgm", p, sigma_x=0.2, sigma_y=0.7, trials=2, seed=3, wrap=spy
    )
    assert release.features.shape == (2, 1, 8) and release.labels is None
    assert release_prime.features.shape == (2, 1, 8) and release.projection is not None
    assert len(calls) == 4
    settings = calls[0][0][5]
    assert (settings.sigma, settings.sigma_norm, settings.batch) == (0.2, 0.7, 2)
    defaults = DPGMParams.model_fields
    assert settings.clip_max == defaults["clip_max"].default
    assert settings.bins == defaults["norm_bins"].default

    # ``train``'s first step on D from the same seed releases the audit's first trial.
    net = dpgm_audit.Probe()
    generator = SecureRandom.from_seed(3)
    X = torch.as_tensor(dpgm_audit.preprocess(nb.X, nb), dtype=torch.float32)
    seen: list[torch.Tensor] = []
    real = dpsgd.noisy_step

    def step(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        seen.append(out[0])
        return out

    with mock.patch.object(dpsgd, "noisy_step", step):
        dpsgd.train(
            net,  # type: ignore[arg-type]
            net.init(dpgm_audit.MODELS),
            X,
            torch.as_tensor(nb.labels),
            torch.ones(dpgm_audit.MODELS, dtype=torch.float64),
            settings,
            sampler=FastNoise(generator),
            generator=generator,
            normal=lambda shape: torch.zeros(shape),
            uniform=lambda shape: torch.zeros(shape),
        )
    assert len(seen) == 1
    assert torch.equal(seen[0].reshape(-1), release.features[0, 0])

    # Record 0's clipped contribution, in units of C, is ±(½, ½, ½, ½) in network 1's block:
    # antipodal and full-norm (shift 2), whatever threshold DPNorm picked.
    noiseless = dataclasses.replace(settings, sigma=1e-300)
    thresholds = (settings.clip_max / settings.bins, 1.0, settings.clip_max)
    for rows, sign in ((nb.X, 1.0), (nb.X_prime, -1.0)):
        x = torch.as_tensor(dpgm_audit.preprocess(rows, nb), dtype=torch.float32)
        for clip in thresholds:
            with mock.patch.object(dpsgd, "dpnorm", lambda *a, c=clip, **k: c):
                out, _ = dpsgd.noisy_step(
                    net,  # type: ignore[arg-type]
                    net.init(dpgm_audit.MODELS),
                    x,
                    torch.as_tensor(nb.labels),
                    torch.arange(len(rows)),
                    noiseless,
                    sampler=FastNoise(SecureRandom.from_seed(0)),
                    normal=lambda shape: torch.zeros(shape),
                    error=0.0,
                )
            expected = torch.zeros((2, 4), dtype=torch.float64)
            expected[1] = sign * 0.5
            assert torch.allclose(out, expected, atol=1e-12)
            assert torch.allclose(
                dpgm_audit.projection() @ torch.as_tensor(x[0], dtype=torch.float64),
                expected.reshape(-1),
            )


# --- statistics ---------------------------------------------------------------------------------


def test_clopper_pearson_upper_bound() -> None:
    # No error in N trials: the bound solves (1 − p)^N = α exactly.
    assert stats.clopper_pearson_upper(np.array([0]), 1000, 0.025)[0] == pytest.approx(
        1 - 0.025 ** (1 / 1000)
    )
    upper = stats.clopper_pearson_upper(np.array([7, 100]), 100, 0.05)
    assert upper[0] == pytest.approx(beta.ppf(0.95, 8, 93)) and upper[1] == 1.0


def test_epsilon_bound_takes_the_stronger_inequality() -> None:
    bound = stats.epsilon_bound(np.array([0.01, 0.5]), np.array([0.5, 0.5]), 0.0)
    assert bound[0] == pytest.approx(math.log(0.5 / 0.01))
    assert bound[1] == 0.0  # a coin flip proves nothing


def test_threshold_is_evaluated_on_fresh_trials() -> None:
    rng = np.random.default_rng(0)
    d, d_prime = rng.normal(0, 1, 20_000), rng.normal(2, 1, 20_000)
    t = stats.choose_threshold(d[:10_000], d_prime[:10_000], 1e-2, 0.05)
    outcome = stats.evaluate(d[10_000:], d_prime[10_000:], t, 1e-2, 0.05)
    assert outcome.fpr == np.mean(d[10_000:] > t)
    assert outcome.fnr == np.mean(d_prime[10_000:] <= t)
    # μ = 2 GDP at δ = 1e-2 is ε ≈ 4.9: the bound is below it and well above 0.
    assert 2.5 < outcome.epsilon_lower_bound < 4.9


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_prints_the_audit() -> None:
    result = CliRunner().invoke(
        cli, ["audit", "local_perturbation", "n=3", "--epsilon", "2", "--trials", "2000"]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["params"] == {"n": 3, "noise_ratio": 1.0}
    assert body["trials"] == {"per_dataset": 2000, "threshold_selection": 1000, "evaluation": 1000}
    assert 0 <= body["epsilon_lower_bound"] < body["epsilon_claimed"] == pytest.approx(2.0)
    assert {"threshold", "tpr", "fpr", "fpr_upper", "fnr_upper", "confidence"} <= set(body)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "dpmix", "--epsilon", "2", "--sigma", "1"], "exactly one"),
        (["audit", "dpmix", "bogus=1", "--epsilon", "2"], "unknown key"),
        (["audit", "dpmix", "mixture_degree=3", "--epsilon", "2"], "mixture_degree"),
    ],
)
def test_cli_refuses_bad_requests(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and message in result.output


def test_every_served_mechanism_is_audited() -> None:
    assert {s.name for s in registry.served()} <= set(audited())
