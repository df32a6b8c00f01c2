"""Reference ``dpsgd_direct`` for the records study's tables: DP-SGD trained on the private rows.

Usage:
    OMP_NUM_THREADS=1 python -m bench.dpsgd_tables --out docs/results [--epsilons 1 10]
        [--datasets ...] [--repeats 3]

What an analyst could do instead of downloading a release of the tables of
``bench/records_study.py`` (``bench/tabular_data.py``: the same 70 % private / 30 % held-out
split, the same declared encoding, δ = 1/n² for n private rows, replace-one neighbours, n
public), tuned as a practitioner tunes it:

- Inputs: each feature mapped by its declared bounds to [−1, 1] (the public transform of the
  study's families; nothing estimated from the rows). Labels: the classes' indices.
- Models: multinomial logistic regression, and an MLP d–128–K with tanh (no normalisation
  layer: batch statistics would mix examples).
- Sampling: Poisson, each row in each step's batch independently with probability exactly
  q = L/n (``bench.dpsgd_cnn.poisson_mask``: ``SecureRandom.bernoulli``).
- Step: per-example gradients (vmap), each clipped to norm C = 1, summed, N(0, (zC)²) added per
  coordinate, divided by the public L; Adam on that (post-processing of the noisy sum).
- Accounting: ``bench.dpsgd_cnn.charged_epsilon`` (dpcore's replace-one Poisson-subsampled
  Gaussian pair, presence bound 1/z, replacement bound 2/z); z the smallest noise multiplier
  (``dpcore.calibration``) whose ε at δ is within the target, asserted.
- Tuning: every configuration of ``GRID`` (model, q, epochs, learning rate) trains on 80 % of
  the private rows (a stratified split with a fixed public seed) at the target ε, calibrated
  for that n, and is scored on the other 20 %; the held-out test rows are not looked at. The
  best configuration per (table, ε) then trains on all private rows, ``--repeats`` times with
  fresh randomness, and is scored once per training on the test rows. As in the DP-SGD
  literature (and ``bench/dpsgd_cnn.py``), the tuning runs are not charged: the charged ε is
  the final training's. The best configuration of each model family is reported (logistic and
  MLP rows), so both families have a tuned reference.

Benchmarks, not the product: float32 gradients and SecureRandom's Box–Muller noise, not the
service's hardened sampler.

Writes OUT/dpsgd_tables_tuning.csv (every tuning run) and OUT/dpsgd_tables.csv and .md (the
final trainings: mean, lowest and highest test accuracy per table, ε and model family).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench import dpsgd_cnn
from bench.tabular_data import DATASETS, Table
from dpcore.mechanisms.secure_random import SecureRandom

EPSILONS = (1.0, 10.0)
TABLES = ("breast_cancer", "wine", "digits", "make_classification")
CLIP = 1.0
HIDDEN = 128
VALIDATION_SHARE = 0.2
SPLIT_SEED = 0  # public: the tuning split does not depend on the data's values


@dataclass(frozen=True)
class Config:
    model: str  # "logistic" or "mlp"
    q: float  # expected batch fraction: L = round(q·n)
    epochs: int  # T = round(epochs / q) steps
    lr: float  # Adam's


#: Every (model, q, epochs, lr) combination. A first grid (epochs 20, 60; lr 0.003–0.03) put
#: several tables' best at its longest training or largest rate, so both were extended.
GRID: tuple[Config, ...] = tuple(
    Config(model, q, epochs, lr)
    for model in ("logistic", "mlp")
    for q in (0.05, 0.2)
    for epochs in (20, 60, 150)
    for lr in (0.003, 0.01, 0.03, 0.1)
)


def network(model: str, d: int, k: int) -> nn.Module:
    if model == "logistic":
        return nn.Linear(d, k)
    return nn.Sequential(nn.Linear(d, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, k))


def scaled(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> torch.Tensor:
    """Declared bounds → [−1, 1], clipped (held-out rows may pass the bounds)."""
    width = np.where(hi > lo, hi - lo, 1.0)
    u = np.clip((np.asarray(X, dtype=np.float64) - lo) / width, 0.0, 1.0)
    return torch.tensor(2.0 * u - 1.0, dtype=torch.float32)


def labels_of(table: Table) -> tuple[torch.Tensor, torch.Tensor]:
    p = table.private
    index = {c: i for i, c in enumerate(p.classes)}
    test = [index.get(v, index.get(str(v), -1)) for v in table.y_test.tolist()]
    if min(test) < 0:
        raise ValueError(f"{table.name}: held-out labels outside the private classes")
    return torch.as_tensor(p.labels, dtype=torch.long), torch.as_tensor(test, dtype=torch.long)


def train(
    x: torch.Tensor, y: torch.Tensor, k: int, cfg: Config, epsilon: float, delta: float
) -> tuple[nn.Module, dict[str, Any]]:
    """DP-SGD (Adam on the noisy clipped sums) on (x, y) at (ε, δ)."""
    start = time.perf_counter()
    n = len(x)
    batch = max(1, round(cfg.q * n))
    steps = max(1, round(cfg.epochs * n / batch))
    z = dpsgd_cnn.calibrate(epsilon, batch, n, steps, delta)
    charged = dpsgd_cnn.charged_epsilon(z, batch, n, steps, delta)
    assert charged <= epsilon, (charged, epsilon)
    torch.manual_seed(dpsgd_cnn.os_seed())  # initial weights: data-independent
    net = network(cfg.model, x.shape[1], k)
    params = {name: p.detach().clone().requires_grad_(False) for name, p in net.named_parameters()}
    per_example = dpsgd_cnn._per_example(net)
    optimiser = torch.optim.Adam(list(params.values()), lr=cfg.lr)
    source = SecureRandom()
    sizes = [v.numel() for v in params.values()]
    for _ in range(steps):
        rows = torch.from_numpy(np.flatnonzero(dpsgd_cnn.poisson_mask(source, batch, n)))
        total = dpsgd_cnn.clipped_sum(per_example, params, x[rows], y[rows], CLIP)
        noise = source.normal((sum(sizes),), dtype=torch.float32).split(sizes)
        for (name, p), e in zip(params.items(), noise, strict=True):
            p.grad = (total[name] + z * CLIP * e.reshape(p.shape)) / batch
        optimiser.step()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(params[name])
    return net, {
        "n": n,
        "batch": batch,
        "steps": steps,
        "z": round(z, 4),
        "charged": charged,
        "seconds": round(time.perf_counter() - start, 1),
    }


def tuning_split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    index = np.arange(len(y))
    fit, check = train_test_split(
        index, test_size=VALIDATION_SHARE, stratify=y, random_state=SPLIT_SEED
    )
    return np.sort(fit), np.sort(check)


def run_table(
    name: str, epsilons: list[float], repeats: int, tuning: csv.DictWriter[str]
) -> list[dict[str, Any]]:
    table = DATASETS[name](10_000)
    p = table.private
    x = scaled(p.X, p.lo, p.hi)
    y, y_test = labels_of(table)
    x_test = scaled(table.X_test, p.lo, p.hi)
    k = len(p.classes)
    delta = 1.0 / p.n_rows**2
    fit, check = tuning_split(p.labels)
    finals: list[dict[str, Any]] = []
    for epsilon in epsilons:
        scores: list[tuple[float, Config]] = []
        for cfg in GRID:
            # δ of the tuning runs: that of a dataset of their size (1/n² as the study's).
            net, info = train(x[fit], y[fit], k, cfg, epsilon, 1.0 / len(fit) ** 2)
            score = dpsgd_cnn.accuracy(net, x[check], y[check])
            scores.append((score, cfg))
            tuning.writerow(
                {"dataset": name, "epsilon": epsilon, **asdict(cfg), "validation": score, **info}
            )
            print(f"{name} ε={epsilon} {cfg}: {score:.3f} ({info['seconds']} s)", file=sys.stderr)
        for model in ("logistic", "mlp"):
            best = max((s for s in scores if s[1].model == model), key=lambda s: s[0])[1]
            for repeat in range(repeats):
                net, info = train(x, y, k, best, epsilon, delta)
                finals.append(
                    {
                        "dataset": name,
                        "epsilon": epsilon,
                        "repeat": repeat,
                        **asdict(best),
                        "test": dpsgd_cnn.accuracy(net, x_test, y_test),
                        **info,
                    }
                )
    return finals


TUNING_FIELDS = ["dataset", "epsilon", "model", "q", "epochs", "lr", "validation"]
INFO_FIELDS = ["n", "batch", "steps", "z", "charged", "seconds"]
FINAL_FIELDS = ["dataset", "epsilon", "repeat", "model", "q", "epochs", "lr", "test", *INFO_FIELDS]


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# DP-SGD trained directly on the records study's tables (reference)",
        "",
        f"Made by: `{command}`",
        "",
        (__doc__ or "").split("Writes OUT")[0].split("\n\n", 2)[2].strip(),
        "",
        "| table | ε | model | tuned: q, epochs, lr | steps | z | charged ε | test accuracy "
        "(mean) | lowest–highest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], float(r["epsilon"]), r["model"]), []).append(r)
    for (dataset, epsilon, model), mine in groups.items():
        tests = [float(r["test"]) for r in mine]
        first = mine[0]
        lines.append(
            f"| {dataset} | {epsilon:g} | {model} | {float(first['q']):g}, {first['epochs']}, "
            f"{float(first['lr']):g} | {first['steps']} | {float(first['z']):.3f} | "
            f"{float(first['charged']):.4f} | {sum(tests) / len(tests):.3f} | "
            f"{min(tests):.3f}–{max(tests):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--datasets", nargs="+", choices=TABLES, default=list(TABLES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="dpsgd_tables")
    args = parser.parse_args(argv)
    command = "python -m bench.dpsgd_tables " + " ".join(argv or sys.argv[1:])
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    finals: list[dict[str, Any]] = []
    with (args.out / f"{args.name}_tuning.csv").open("w", newline="") as handle:
        tuning = csv.DictWriter(handle, fieldnames=TUNING_FIELDS + INFO_FIELDS)
        tuning.writeheader()
        for name in args.datasets:
            finals += run_table(name, args.epsilons, args.repeats, tuning)
            handle.flush()
    with (args.out / f"{args.name}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FINAL_FIELDS)
        writer.writeheader()
        writer.writerows(finals)
    (args.out / f"{args.name}.md").write_text(markdown(finals, command.strip()))
    assert all(math.isfinite(float(r["test"])) for r in finals)


if __name__ == "__main__":
    main()
