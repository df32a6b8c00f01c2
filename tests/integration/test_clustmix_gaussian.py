"""ClustMix model gaussian through the service: admission fills one cluster per class, the
preview and the release charge the three final noises, and the file holds n distinct rows in
raw units inside the declared range, exactly labelled; a spread with it is refused."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset

BUDGET = {"epsilon": 20.0, "delta": 1e-5}
N = 300


def _body(dataset_id: str, **params: Any) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "mechanism": "clustmix",
        "params": {"model": "gaussian", **params},
        "epsilon": 4.0,
        "format": "npz",
    }


@pytest.mark.modes("real")
def test_clustmix_gaussian_release(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset(n=N)), budget=BUDGET)
    assert r.status_code == 201, r.text
    ds = r.json()

    refused = h.client.post("/releases", json=_body(ds["id"], spread=0.5), headers=h.headers(owner))
    assert refused.status_code == 422, refused.text
    assert "spread applies to model means only" in refused.json()["error"]["message"]

    preview = h.client.post("/releases/preview", json=_body(ds["id"]), headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    p = preview.json()
    assert p["params"]["model"] == "gaussian" and p["params"]["clusters_per_class"] == 1
    assert 0 < p["charge"]["epsilon"] <= 4.0
    assert '"second"' in json.dumps(p)

    created = h.client.post("/releases", json=_body(ds["id"]), headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"], timeout=300)
    assert done["status"] == "succeeded", done
    assert 0 < done["charge"]["epsilon"] <= 4.0

    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    X, y = np.asarray(npz["X"], dtype=np.float64), np.asarray(npz["y"])
    assert X.shape == (N, 6)
    # Raw units inside the declared feature_range [0, 13].
    assert X.min() >= 0.0 and X.max() <= 13.0 * (1 + 1e-6)
    assert len(np.unique(X.round(5), axis=0)) >= 0.9 * N
    assert np.all(y.sum(axis=1) == 1) and set(np.unique(y).tolist()) == {0, 1}
    meta = json.loads(str(npz["metadata"]))
    assert "Gaussians" in json.dumps(meta)
