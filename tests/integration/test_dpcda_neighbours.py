"""DP-CDA's default is DP for every pair of replace-one neighbours: whether a release is
admitted, and what it publishes at admission, reads no private class count. The opt-in
'declared' class sizes keep their narrower relation, and say so.

The neighbours: n = 2000 records in two classes, D with 500 in class 0 and D′ the same but
one record of class 0 moved to class 1 (499). The requested floor m = 500 — the default,
⌊n/(2·classes)⌋ — holds on D and fails on D′ by one record."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from tests.conftest import Harness, npz_bytes

N, FLOOR = 2000, 500
PUBLISHED = ("mechanism", "params", "accountant", "noise", "charge", "neighbour_relation")


def _neighbours() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    X = rng.uniform(0.0, 1.0, size=(N, 4))
    y = np.zeros(N, dtype=np.int64)
    y[FLOOR:] = 1  # 500 of class 0, 1500 of class 1
    y_prime = y.copy()
    y_prime[0] = 1  # one record moves from class 0 to class 1: 499 and 1501
    X_prime = X.copy()
    X_prime[0] = X[0] + 0.5  # and changes its features (replace-one, not only relabel)
    assert np.bincount(y).min() == FLOOR and np.bincount(y_prime).min() == FLOOR - 1
    return (X, y), (X_prime, y_prime)


def _upload(h: Harness, owner: str, X: np.ndarray, y: np.ndarray) -> str:
    r = h.upload(
        owner,
        npz_bytes(X, y),
        metadata={
            "name": "neighbour",
            "feature_range": [0.0, 2.0],
            "classes": [0, 1],
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        },
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _body(dataset_id: str, params: dict[str, Any]) -> dict[str, Any]:
    # δ given: the default δ is a share of what is left, the same on both datasets anyway.
    return {
        "dataset_id": dataset_id,
        "mechanism": "dpcda",
        "params": params,
        "epsilon": 1.0,
        "delta": 1e-6,
    }


def _published(out: dict[str, Any]) -> dict[str, Any]:
    return {k: out[k] for k in PUBLISHED}


def test_default_dpcda_is_admitted_alike_on_neighbours(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    (X, y), (X_prime, y_prime) = _neighbours()
    ids = [_upload(h, owner, X, y), _upload(h, owner, X_prime, y_prime)]

    # The default request (every parameter left to its default): the same plan on both.
    previews = []
    for dataset_id in ids:
        r = h.client.post("/releases/preview", json=_body(dataset_id, {}), headers=h.headers(owner))
        assert r.status_code == 200, r.text
        previews.append(r.json())
    assert _published(previews[0]) == _published(previews[1])
    # Public figures only: the same warnings on both; none about mixing, since a balanced
    # class (1 000) holds well over min_class_size plus the DP bounds' margin.
    assert previews[0]["warnings"] == previews[1]["warnings"]
    assert "classes_may_not_mix" not in [w["code"] for w in previews[0]["warnings"]]
    params = previews[0]["params"]
    assert params["class_sizes"] == "dp" and params["min_class_size"] == FLOOR
    assert params["count_noise"] is not None and params["count_noise"] > 0
    assert previews[0]["neighbour_relation"] == "replace-one (n public)"
    assert {s["name"] for s in previews[0]["noise"]["scales"]} == {"counts", "features"}

    # Admitted on both, with the same published parameters, noise and charge.
    created = []
    for dataset_id in ids:
        r = h.client.post("/releases", json=_body(dataset_id, {}), headers=h.headers(owner))
        assert r.status_code == 202, r.text
        created.append(r.json())
    assert _published(created[0]) == _published(created[1])
    assert _published(created[0]) == {
        **_published(previews[0]),
        "charge": {**created[0]["charge"]},  # admission adds how the filter charged it
    }
    assert created[0]["charge"]["epsilon"] == previews[0]["charge"]["epsilon"] <= 1.0
    for release in created:
        done = h.wait(owner, release["id"])
        assert done["status"] == "succeeded", done
        with np.load(io.BytesIO(h.download(owner, done["id"]))) as z:
            meta = json.loads(str(z["metadata"]))
        assert meta["accountant"]["neighbouring_relation"] == "replace-one (n public)"
        assert meta["params"] == params
        # The job read back the β and count noise admission charged.
        sizes = meta["preprocessing"]
        assert sizes["class_size_failure_prob"] == params["class_size_failure_prob"]
        assert len(sizes["dp_class_counts"]) == 2 and isinstance(sizes["mixed"], bool)
        ledger = h.client.get(f"/budgets/{release['dataset_id']}", headers=h.headers(owner))
        (entry,) = ledger.json()["entries"]
        assert entry["neighbour_relation"] == "replace-one (n public)"

    # The finding the default closes: the opt-in 'declared' floor m = 500 is admitted on D
    # and refused on D′, so it holds only over datasets whose classes all reach m — which the
    # release, its metadata and its ledger entry state (test_mechanisms.test_dpcda_release).
    declared = {"min_class_size": FLOOR, "class_sizes": "declared"}
    r = h.client.post("/releases/preview", json=_body(ids[0], declared), headers=h.headers(owner))
    assert r.status_code == 200, r.text
    assert f"at least {FLOOR} records" in r.json()["neighbour_relation"]
    r = h.client.post("/releases/preview", json=_body(ids[1], declared), headers=h.headers(owner))
    assert r.status_code == 422 and "not a lower bound" in r.text, r.text


# Small tables: the class counts of breast-cancer (569 rows, 212/357) and wine (178 rows,
# 59/71/48), with features of their widths. At ε = 1 the public count-noise rule alone cost
# more than the target there; the default request is admitted with count_noise chosen for it.
SMALL_TABLES = {"breast_cancer": (30, (212, 357)), "wine": (13, (59, 71, 48))}


def test_the_default_at_epsilon_1_is_admitted_on_small_tables_and_says_what_it_did(
    embedded: Harness,
) -> None:
    from dpcore.mechanisms.dpcda.params import default_count_noise

    h = embedded
    owner, _ = h.new_key("owner")
    rng = np.random.default_rng(5)
    for name, (d, counts) in SMALL_TABLES.items():
        y = np.concatenate([np.full(c, i) for i, c in enumerate(counts)]).astype(np.int64)
        X = rng.uniform(0.0, 1.0, size=(y.size, d))
        r = h.upload(
            owner,
            npz_bytes(X, y),
            metadata={
                "name": name,
                "feature_range": [0.0, 1.0],
                "classes": list(range(len(counts))),
                "budget": {"epsilon": 10.0, "delta": 1e-5},
            },
        )
        assert r.status_code == 201, r.text
        body = {"dataset_id": r.json()["id"], "mechanism": "dpcda", "params": {}, "epsilon": 1.0}
        preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
        assert preview.status_code == 200, preview.text
        params = preview.json()["params"]
        # The owner is told before paying that such classes are unlikely to mix.
        codes = [w["code"] for w in preview.json()["warnings"]]
        assert "classes_may_not_mix" in codes, name
        public = default_count_noise(params["min_class_size"], len(counts))
        assert params["count_noise"] > public, name
        created = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert created.status_code == 202, created.text
        release = created.json()
        assert release["params"] == params
        assert release["charge"]["epsilon"] == preview.json()["charge"]["epsilon"] <= 1.0
        counts_noise = {s["name"]: s["sigma"] for s in release["noise"]["scales"]}["counts"]
        assert counts_noise == params["count_noise"]
        done = h.wait(owner, release["id"])
        assert done["status"] == "succeeded", done
        with np.load(io.BytesIO(h.download(owner, done["id"]))) as z:
            meta = json.loads(str(z["metadata"]))
        sizes = meta["preprocessing"]
        assert meta["params"] == params
        assert sizes["count_noise"] == params["count_noise"]
        if name == "wine":
            # The bounds sit about 6·count_noise below the noisy counts, far more than the
            # classes (≤ 71 records) exceed m = 29 by: mixing has negligible probability.
            assert sizes["mixed"] is False
        if not sizes["mixed"]:
            assert f"below min_class_size {params['min_class_size']}" in sizes["not_mixed"]
