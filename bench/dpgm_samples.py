"""DPGM on MNIST-10k: one release with the default parameters at each ε (secure sampler, as
the service makes it), its wall time on this machine, and a PNG grid of samples per cluster
(one row per trained network, like Fig. 3 of Acs et al.).

    OMP_NUM_THREADS=1 python bench/dpgm_samples.py --epsilons 1 10 --out docs/results

Writes OUT/dpgm_samples_eps{ε}[_{param}{value}…].png and prints one JSON line per release
(wall seconds split into calibration and the job, the networks' classes and noisy sizes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mnist import DELTA, load_private  # noqa: E402
from bench.sweet_spot import calibrated, generated  # noqa: E402
from dpcore.mechanisms.dpgm.models import family  # noqa: E402
from dpcore.mechanisms.run import materialise  # noqa: E402

PER_ROW = 8


def grid(images: list[np.ndarray], rows: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, PER_ROW, figsize=(PER_ROW * 0.9, rows * 0.9 + 0.4))
    for ax, image in zip(np.asarray(axes).reshape(-1), images, strict=False):
        ax.imshow(image.reshape(28, 28), cmap="gray", vmin=0, vmax=1)
        ax.axis("off")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(epsilon: float, out: Path, request: dict[str, Any]) -> dict[str, Any]:
    parsed = load_private()
    start = time.perf_counter()
    spec, params, event = calibrated("dpgm", {**request, "weights": True}, parsed, epsilon, DELTA)
    calibrated_at = time.perf_counter()
    output = generated(spec, params, parsed, event)
    X, _, _, _ = materialise(output)
    finished = time.perf_counter()
    (artifact,) = output.artifacts
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / artifact.name
        artifact.write(path)
        weights = load_file(str(path))
    classes = weights.pop("cluster_class")
    sizes = weights.pop("cluster_noisy_size")
    net = family(params.model, X.shape[1], params.hidden, params.latent_dim)
    draw = torch.Generator().manual_seed(0)  # public: the picture's own randomness
    images = []
    for m in range(classes.shape[0]):
        models = torch.full((PER_ROW,), m, dtype=torch.int64)
        with torch.no_grad():
            rows = net.sample_rows(weights, models, lambda s: torch.randn(s, generator=draw))
        images.extend(rows.numpy())
    suffix = "".join(f"_{k}{v}" for k, v in sorted(request.items()))
    name = f"dpgm_samples_eps{epsilon:g}{suffix}.png"
    grid(
        images,
        classes.shape[0],
        out / name,
        f"DPGM ({params.model.upper()}, {json.dumps(request) if request else 'defaults'}) "
        f"on MNIST-10k, ε = {epsilon:g}, δ = 1e-5:\n"
        f"{PER_ROW} samples per network (row m: class {', '.join(map(str, classes.tolist()))})",
    )
    described = event.describe()
    return {
        "epsilon": epsilon,
        "charge": event.epsilon(DELTA),
        "calibration_s": round(calibrated_at - start, 1),
        "job_s": round(finished - calibrated_at, 1),
        "sgd_steps": described["sgd_steps"],
        "batch_size": described["batch_size"],
        "sigma_sgd": round(described["sigma_sgd"], 4),
        "sigma_kmeans": round(described["sigma_kmeans"], 3),
        "classes": classes.tolist(),
        "noisy_sizes": [round(float(s), 1) for s in sizes],
        "png": name,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--request", type=json.loads, default={}, help="extra params (JSON)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for epsilon in args.epsilons:
        print(json.dumps(run(epsilon, args.out, args.request)), flush=True)


if __name__ == "__main__":
    main()
