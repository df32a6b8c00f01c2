"""Preview time on a wide dataset: an embedded server, a 1 × d NPZ upload (a tiny compressed
file with d features), then ``POST /releases/preview`` per mechanism, timed.

    OMP_NUM_THREADS=1 python bench/preview_wide.py --features 1000000 10000000
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time

import numpy as np
from fastapi.testclient import TestClient

from service.config import Settings
from service.run import app_factory

MECHANISMS = ("local_perturbation", "dpmix", "dpcda", "clustmix", "mst")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, nargs="+", default=[1_000_000])
    args = parser.parse_args()
    admin = "bench-admin-" + "k" * 32
    settings = Settings(home=tempfile.mkdtemp(prefix="dprelease-bench-"), admin_key=admin)  # type: ignore[call-arg]
    with TestClient(app_factory(settings)) as client:
        key = client.post(
            "/api-keys",
            json={"name": "owner", "role": "owner"},
            headers={"Authorization": f"Bearer {admin}"},
        ).json()["key"]
        owner = {"Authorization": f"Bearer {key}"}
        print("| features | mechanism | preview status | seconds |")
        print("|---|---|---|---|")
        for d in args.features:
            buffer = io.BytesIO()
            np.savez_compressed(buffer, X=np.zeros((1, d), dtype=np.uint8), y=np.array([0]))
            meta = {
                "name": f"wide-{d}",
                "feature_range": [0, 1],
                "classes": [0, 1],
                "budget": {"epsilon": 10, "delta": 1e-5},
            }
            r = client.post(
                "/datasets",
                files={"file": ("wide.npz", buffer.getvalue())},
                data={"metadata": json.dumps(meta)},
                headers=owner,
            )
            if r.status_code != 201:
                print(f"| {d} | (upload) | {r.status_code} {r.json()['error']['code']} | — |")
                continue
            dataset = r.json()["id"]
            for mechanism in MECHANISMS:
                body = {"dataset_id": dataset, "mechanism": mechanism, "epsilon": 1.0}
                start = time.perf_counter()
                r = client.post("/releases/preview", json=body, headers=owner)
                seconds = time.perf_counter() - start
                print(f"| {d} | {mechanism} | {r.status_code} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
