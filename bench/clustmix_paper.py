"""ClustMix variant paper (Algorithm 2, a research release) on MNIST-10k: calibrate with the
paper accountant at ε (its claim, not a bound), build the release as the worker does, and
report sklearn MLP and ridge accuracy on the 5000 held-out test images. One JSON line per
setting.

    OMP_NUM_THREADS=1 python bench/clustmix_paper.py EPSILON '[{"sigma_max": 1.0}, ...]'
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch

from bench.mnist import DELTA, load_private, load_test
from dpcore.evaluation import Release, evaluate
from dpcore.mechanisms import registry
from dpcore.mechanisms.run import build, facts_of, materialise, params_of, randomness


def main() -> None:
    parsed = load_private()
    test = load_test()
    spec = registry.get("clustmix")
    acc = spec.accountant("paper")
    eps = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    settings = json.loads(sys.argv[2]) if len(sys.argv) > 2 else [{}]
    for extra in settings:
        request = {"variant": "paper", "n_samples": 2000, **extra}
        params = params_of(spec, request)
        keys = spec.accountant_keys(acc, params, facts_of(parsed))
        t0 = time.perf_counter()
        event = acc.calibrate(eps, DELTA, keys)
        generator, draws = randomness("secure")
        stages = {}

        def report(done, total, phase, _s=stages, _t=t0):
            _s[phase] = round(time.perf_counter() - _t, 1)

        out = build(
            spec,
            params,
            parsed,
            noise=event.noise(),
            sampler=draws,
            generator=generator,
            device=torch.device("cpu"),
            report=report,
        )
        X32, Y32, _, _ = materialise(out)
        gen_s = time.perf_counter() - t0
        meta = {
            "mechanism": "clustmix",
            "params": params.model_dump(),
            "classes": list(parsed.classes),
            "feature_shape": list(parsed.feature_shape),
            "feature_range": {"lo": parsed.lo.tolist(), "hi": parsed.hi.tolist()},
        }
        rel = Release(X32.astype(np.float64), Y32.astype(np.float64), meta, out.extra)
        rep = evaluate(rel, test[0], test[1], classifiers=("sklearn_mlp", "linear"))
        print(
            json.dumps(
                {
                    "eps": eps,
                    "extra": extra,
                    "l": event.cluster_size,
                    "sigma": round(event.sigma, 4),
                    "eps_charged": round(event.epsilon(DELTA), 4),
                    "rows": out.rows,
                    "clusters": out.preprocessing["clusters"][:40],
                    "gen_s": round(gen_s, 1),
                    "phases_end_s": stages,
                    "acc": rep["accuracy"],
                    "train_s": rep["seconds"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
