"""Accountants of the two baselines of DPMix's Section IV: local perturbation and random
projection (Lee et al., ISIT 2019, ``../shared/seeds/000_…``).

Records are preprocessed as for DPMix: features in [0, 1] with ‖x‖ ≤ 1, so two records differ
by ‖x − x′‖ ≤ √2 (‖x − x′‖² = ‖x‖² + ‖x′‖² − 2⟨x, x′⟩ ≤ 2 as ⟨x, x′⟩ ≥ 0), and one-hot labels,
‖y − y′‖ ≤ √2. Neighbours are replace-one with n public. Every record is released exactly once.

``local_perturbation`` releases (x_i + N(0, σ_x² I), y_i + N(0, σ_y² I)) for every record i.

- ``tight``: replacing record i changes only its own released row, by ≤ √2 in features and ≤ √2
  in labels; the row is the Gaussian mechanism, μ-GDP with μ = √(2/σ_x² + 2/σ_y²) (the two
  blocks scaled by their noise stds form one Gaussian), converted to (ε, δ) exactly.
- ``paper``: the paper calls local perturbation "the Gaussian mechanism applied to each data
  point, i.e. ℓ = 1", read here as its Theorem 1 with ℓ = 1 and T = n mixtures
  (``DPMixPaperEvent``, sampling ratio p = 1/n, Δ² = d_X/σ_x² + d_Y/σ_y²). That reading treats each
  released row as a *uniformly drawn* record (amplification by sampling), which is not what the
  mechanism does: it releases every record once, so a given record is in the output with
  probability 1. It is NOT a valid bound for this mechanism (report it, never ledger it).

``random_projection`` draws a data-independent Gaussian matrix R (d × d_x, d =
``projection_dim``), rescales it to spectral norm s = ``spectral_norm`` and releases
(R x_i + N(0, σ² I_d), y_i + N(0, σ_y² I)) for every record i.

- ``tight``: ‖R(x − x′)‖ ≤ s‖x − x′‖ ≤ √2·s (R is fixed independently of the data, so conditioning
  on it is free), labels √2: μ-GDP with μ = √(2s²/σ² + 2/σ_y²), exact conversion.
- ``paper``: the noise std σ = s·√(log(1/(2δ)) + ε)/ε as printed (formula ``sqrt_sum``), citing
  Kenthapadi et al. (JL transform) and DPPro. Inverting for ε with r = σ/s (noise per unit of
  sensitivity): r²ε² − ε − log(1/(2δ)) = 0, so ε = (1 + √(1 + 4r² log(1/(2δ))))/(2r²). The
  alternative parenthesisation σ = s(√log(1/(2δ)) + ε)/ε (formula ``sqrt_log``) inverts to
  ε = √log(1/(2δ))/(r − 1), finite only for r > 1. Conditions of the cited result: the Gaussian
  mechanism lemma of Kenthapadi et al. needs δ < 1/2 (so that log(1/(2δ)) > 0) and
  σ ≥ Δ·√(2(log(1/(2δ)) + ε))/ε, whose proof is the tail bound P[N(0,1) > t] ≤ ½e^{−t²/2} at
  t² ≥ 2 log(1/(2δ)) + ε; the printed formula lacks the factor 2 under the root (it gives
  t² ≥ log(1/(2δ)) only, i.e. a tail ½√(2δ) ≫ δ). It also takes Δ = σ(R) = s, i.e. ‖x − x′‖ ≤ 1,
  while replace-one gives √2·s. Not a valid bound (report only). Labels: Section IV says nothing
  about them (the random-projection data is used to train a classifier, so they are released
  in some form). dprelease releases them with N(0, σ_y²) and charges them with the same cited
  formula in the paper's own convention (per-block input difference ≤ 1): the pair is one
  Gaussian mechanism on (R x/σ, y/σ_y) whose sensitivity in noise units is √(s²/σ² + 1/σ_y²),
  i.e. r = (s²/σ² + 1/σ_y²)^(−1/2) in the inversion above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpcore.accounting import gdp
from dpcore.accounting.composition import ApproximateDPEvent, GaussianEvent
from dpcore.accounting.dpmix import sigma_y_of
from dpcore.accounting.dpmix_paper import DPMixPaperEvent
from dpcore.accounting.registry import Accountant, Event, Key, register

FEATURE_SENSITIVITY = math.sqrt(2.0)  # ‖x − x′‖ after preprocessing, see the module docstring
LABEL_SENSITIVITY = math.sqrt(2.0)  # one-hot labels
PAPER_FORMULAS = ("sqrt_sum", "sqrt_log")


def _positive(name: str, value: Any) -> float:
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return out


def _integer(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if out < low:
        raise ValueError(f"{name} must be >= {low}, got {out}")
    return out


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


# --- local perturbation ------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalPerturbationEvent(GaussianEvent):
    """Every record released once with Gaussian noise: μ-GDP, μ = √(2/σ_x² + 2/σ_y²)."""

    n: int
    sigma_x: float
    sigma_y: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _integer("n", self.n))
        object.__setattr__(self, "sigma_x", _positive("sigma_x", self.sigma_x))
        object.__setattr__(self, "sigma_y", _positive("sigma_y", self.sigma_y))

    @property
    def mu(self) -> float:
        return math.sqrt(
            (FEATURE_SENSITIVITY / self.sigma_x) ** 2 + (LABEL_SENSITIVITY / self.sigma_y) ** 2
        )

    def noise(self) -> dict[str, float]:
        return {"sigma_x": self.sigma_x, "sigma_y": self.sigma_y}

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "local_perturbation",
            "accountant": "tight",
            "mu": self.mu,
            **asdict(self),
        }


@dataclass(frozen=True)
class LocalPerturbationPaperEvent(ApproximateDPEvent):
    """The paper's reading: DPMix Theorem 1 with ℓ = 1 and T = n (not valid, see module)."""

    n: int
    sigma_x: float
    sigma_y: float
    d_x: int
    d_y: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _integer("n", self.n))
        object.__setattr__(self, "sigma_x", _positive("sigma_x", self.sigma_x))
        object.__setattr__(self, "sigma_y", _positive("sigma_y", self.sigma_y))
        object.__setattr__(self, "d_x", _integer("d_x", self.d_x))
        object.__setattr__(self, "d_y", _integer("d_y", self.d_y))

    @property
    def as_dpmix(self) -> DPMixPaperEvent:
        return DPMixPaperEvent(
            self.n, 1, self.n, self.sigma_x, self.sigma_y, self.d_x, self.d_y, "mixture"
        )

    def epsilon(self, delta: float) -> float:
        _check_delta(delta)
        return self.as_dpmix.epsilon(delta)

    def noise(self) -> dict[str, float]:
        return {"sigma_x": self.sigma_x, "sigma_y": self.sigma_y}

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "local_perturbation",
            "accountant": "paper",
            "reading": "DPMix Theorem 1 with mixture_degree = 1, n_samples = n",
            **asdict(self),
        }


# --- random projection ------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomProjectionEvent(GaussianEvent):
    """R x_i + N(0, σ² I) and y_i + N(0, σ_y² I) per record: μ = √(2s²/σ² + 2/σ_y²)."""

    n: int
    projection_dim: int
    spectral_norm: float
    sigma: float
    sigma_y: float

    def __post_init__(self) -> None:
        _coerce_projection(self)

    @property
    def mu(self) -> float:
        feature = FEATURE_SENSITIVITY * self.spectral_norm / self.sigma
        return math.sqrt(feature**2 + (LABEL_SENSITIVITY / self.sigma_y) ** 2)

    def noise(self) -> dict[str, float]:
        return {"sigma_x": self.sigma, "sigma_y": self.sigma_y}

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "random_projection",
            "accountant": "tight",
            "mu": self.mu,
            **asdict(self),
        }


def paper_epsilon(ratio: float, delta: float, formula: str = "sqrt_sum") -> float:
    """ε solving the paper's σ = s·f(ε, δ) for the noise-to-sensitivity ratio r = σ/s.

    ``sqrt_sum``: r = √(log(1/(2δ)) + ε)/ε → ε = (1 + √(1 + 4r²L))/(2r²);
    ``sqrt_log``: r = (√L + ε)/ε → ε = √L/(r − 1) (inf for r ≤ 1); L = log(1/(2δ)).
    """
    if not 0 < delta < 0.5:
        raise ValueError(f"the cited Gaussian bound needs delta in (0, 1/2), got {delta}")
    r = _positive("ratio", ratio)
    log_term = math.log(1 / (2 * delta))
    if formula == "sqrt_sum":
        return (1 + math.sqrt(1 + 4 * r * r * log_term)) / (2 * r * r)
    if formula == "sqrt_log":
        return math.sqrt(log_term) / (r - 1) if r > 1 else math.inf
    raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}, got {formula!r}")


def paper_sigma(epsilon: float, delta: float, formula: str = "sqrt_sum") -> float:
    """The paper's noise-to-sensitivity ratio σ/s for (ε, δ), as printed."""
    eps = _positive("epsilon", epsilon)
    if not 0 < delta < 0.5:
        raise ValueError(f"the cited Gaussian bound needs delta in (0, 1/2), got {delta}")
    log_term = math.log(1 / (2 * delta))
    if formula == "sqrt_sum":
        return math.sqrt(log_term + eps) / eps
    if formula == "sqrt_log":
        return (math.sqrt(log_term) + eps) / eps
    raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}, got {formula!r}")


@dataclass(frozen=True)
class RandomProjectionPaperEvent(ApproximateDPEvent):
    """The paper's stated noise level inverted for ε (not valid, see module docstring)."""

    n: int
    projection_dim: int
    spectral_norm: float
    sigma: float
    sigma_y: float
    formula: str = "sqrt_sum"

    def __post_init__(self) -> None:
        _coerce_projection(self)
        if self.formula not in PAPER_FORMULAS:
            raise ValueError(f"formula must be one of {', '.join(PAPER_FORMULAS)}")

    @property
    def ratio(self) -> float:
        """r: noise per unit of the paper's sensitivity, features (s) and labels (1) jointly."""
        return 1.0 / math.sqrt((self.spectral_norm / self.sigma) ** 2 + 1 / self.sigma_y**2)

    def epsilon(self, delta: float) -> float:
        return paper_epsilon(self.ratio, delta, self.formula)

    def noise(self) -> dict[str, float]:
        return {"sigma_x": self.sigma, "sigma_y": self.sigma_y}

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "random_projection",
            "accountant": "paper",
            "ratio": self.ratio,
            **asdict(self),
        }


def _coerce_projection(event: RandomProjectionEvent | RandomProjectionPaperEvent) -> None:
    object.__setattr__(event, "n", _integer("n", event.n))
    object.__setattr__(event, "projection_dim", _integer("projection_dim", event.projection_dim))
    for name in ("spectral_norm", "sigma", "sigma_y"):
        object.__setattr__(event, name, _positive(name, getattr(event, name)))


# --- registry --------------------------------------------------------------------------------

NOISE_KEYS = (
    Key("sigma_y", float, "label noise std when it differs from --sigma", required=False),
    Key(
        "noise_ratio",
        float,
        "σ_y/σ used when calibrating (ignored when sigma_y is set)",
        required=False,
        default=1.0,
    ),
)
PROJECTION_KEYS = (
    Key("projection_dim", int, "d: rows of the projection matrix R (d × d_x)"),
    Key(
        "spectral_norm",
        float,
        "s: spectral norm R is rescaled to (data-independent)",
        required=False,
        default=1.0,
    ),
    Key(
        "formula",
        str,
        "paper accountant only: sqrt_sum = s√(log(1/(2δ)) + ε)/ε as printed, "
        "sqrt_log = s(√log(1/(2δ)) + ε)/ε",
        required=False,
        default="sqrt_sum",
        choices=PAPER_FORMULAS,
    ),
)


def _gdp_guess(sensitivity_sq: float) -> Any:
    # σ with √(sensitivity_sq)/σ = the μ meeting (ε, δ), treating σ_y = ratio·σ.
    def guess(keys: Mapping[str, Any], epsilon: float, delta: float) -> float:
        ratio = keys["noise_ratio"] if keys["sigma_y"] is None else 1.0
        scale = keys.get("spectral_norm") or 1.0
        mu = gdp.mu_for_epsilon(epsilon, delta)
        return math.sqrt(sensitivity_sq * (scale**2 + 1 / ratio**2)) / mu

    return guess


def _local_tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return LocalPerturbationEvent(keys["n"], sigma, sigma_y_of(sigma, keys))


def _local_paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    return LocalPerturbationPaperEvent(
        keys["n"], sigma, sigma_y_of(sigma, keys), keys["d_x"], keys["d_y"]
    )


def _projection_tight(sigma: float, keys: Mapping[str, Any]) -> Event:
    return RandomProjectionEvent(
        keys["n"],
        keys["projection_dim"],
        keys["spectral_norm"],
        sigma,
        sigma_y_of(sigma, keys),
    )


def _projection_paper(sigma: float, keys: Mapping[str, Any]) -> Event:
    return RandomProjectionPaperEvent(
        keys["n"],
        keys["projection_dim"],
        keys["spectral_norm"],
        sigma,
        sigma_y_of(sigma, keys),
        keys["formula"],
    )


LOCAL_TIGHT = register(
    Accountant(
        mechanism="local_perturbation",
        name="tight",
        summary="every record released once: Gaussian mechanism, μ = √(2/σ_x² + 2/σ_y²), "
        "exact GDP conversion",
        keys=(
            Key("n", int, "number of records (public)"),
            Key("d_x", int, "feature dimension (paper accountant only)", required=False),
            Key("d_y", int, "label dimension (paper accountant only)", required=False),
            *NOISE_KEYS,
        ),
        build=_local_tight,
        guess=_gdp_guess(2.0),
    )
)

LOCAL_PAPER = register(
    Accountant(
        mechanism="local_perturbation",
        name="paper",
        summary="the paper's 'DPMix with ℓ = 1': Theorem 1 with ℓ = 1, T = n, Δ² = d_x/σ_x² + "
        "d_y/σ_y²",
        keys=(
            Key("n", int, "number of records (public)"),
            Key("d_x", int, "feature dimension d_X"),
            Key("d_y", int, "label dimension d_Y (number of classes)"),
            *NOISE_KEYS,
        ),
        build=_local_paper,
        guess=_gdp_guess(2.0),
        valid_bound=False,
        caveat="treats each released row as a uniformly sampled record (amplification by "
        "sampling), but local perturbation releases every record once",
    )
)

PROJECTION_TIGHT = register(
    Accountant(
        mechanism="random_projection",
        name="tight",
        summary="every record released once as R x + noise: Gaussian mechanism, "
        "μ = √(2s²/σ² + 2/σ_y²), exact GDP conversion",
        keys=(
            Key("n", int, "number of records (public)"),
            *PROJECTION_KEYS,
            Key("d_x", int, "feature dimension (not used by the accountants)", required=False),
            Key("d_y", int, "label dimension (not used by the accountants)", required=False),
            *NOISE_KEYS,
        ),
        build=_projection_tight,
        guess=_gdp_guess(2.0),
    )
)

PROJECTION_PAPER = register(
    Accountant(
        mechanism="random_projection",
        name="paper",
        summary="the paper's noise σ = s·√(log(1/(2δ)) + ε)/ε inverted for ε (features and "
        "labels as one Gaussian in the paper's unit-difference convention)",
        keys=(
            Key("n", int, "number of records (public)"),
            *PROJECTION_KEYS,
            Key("d_x", int, "feature dimension (not used by the accountants)", required=False),
            Key("d_y", int, "label dimension (not used by the accountants)", required=False),
            *NOISE_KEYS,
        ),
        build=_projection_paper,
        guess=_gdp_guess(1.0),
        valid_bound=False,
        caveat="the printed noise lacks the factor √2 of the cited Gaussian bound and takes "
        "sensitivity s, while replace-one moves R x by up to √2·s",
    )
)
