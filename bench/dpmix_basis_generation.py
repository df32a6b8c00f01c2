"""The DPMix generator alone on MNIST-60k's shape: 60 000 × 784 unit rows (random), the default
2-D DCT basis (k = 64), ℓ = 64, T = 60 000 rows, secure noise; three passes, seconds each.
docs/results/implementation.md, "DPMix and DP-CDA: projected rows gathered in float32".

    python -m bench.dpmix_basis_generation
"""

from __future__ import annotations

import json
import time

import torch

from dpcore.mechanisms.basis import basis_for
from dpcore.mechanisms.dpmix.generate import generate
from dpcore.mechanisms.dpmix.params import DPMixParams
from dpcore.mechanisms.noise import SecureNoise
from dpcore.mechanisms.secure_random import SecureRandom


def main() -> None:
    torch.set_num_threads(2)
    generator = SecureRandom()
    X = torch.rand(60_000, 784)
    X = X / X.norm(dim=1, keepdim=True)
    Y = torch.nn.functional.one_hot(torch.randint(0, 10, (60_000,)), 10).float()
    params = DPMixParams(mixture_degree=64, n_samples=60_000)
    basis = basis_for(params, (28, 28), 784, 64)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for _chunk in generate(
            X,
            Y,
            mixture_degree=64,
            n_samples=60_000,
            sigma_x=0.05,
            sigma_y=0.05,
            generator=generator,
            noise=SecureNoise(source=generator),
            basis=basis,
        ):
            pass
        seconds.append(round(time.perf_counter() - start, 3))
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    main()
