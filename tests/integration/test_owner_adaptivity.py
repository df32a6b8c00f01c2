"""What the owner sees that is not differentially private never feeds what the service publishes.

The ledger's filter theorem assumes each request is chosen from public history. The service
cannot read the owner's mind, but everything it fills in or suggests — defaulted parameters,
the default δ, the way of charging, recommended configurations, admission itself — must be a
function of public facts and earlier DP outputs only (docs/privacy.md, "Adaptivity and the
owner"). Two neighbouring datasets, one of which also had an owner-only utility report and a
research release made on it, must get the same answer to every preview and to the default
release request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcore.mechanisms import registry
from tests.conftest import Harness, npz_bytes

BUDGET = {"epsilon": 20.0, "delta": 1e-5}
CLASSES = [0, 1, 2]


def _neighbours() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Replace-one neighbours whose smallest class differs: in the second, one record of the
    smallest class is replaced by a record of the largest one. The smallest class holds exactly
    half a balanced class (⌊n / 2K⌋ = 333) in the first and one fewer in the second: a check of
    any public floor of that size against the private counts answers differently."""
    rng = np.random.default_rng(7)
    y = np.repeat([0, 1, 2], [333, 800, 867])
    X = rng.uniform(0, 10, size=(y.size, 6)) + y[:, None]
    y2, X2 = y.copy(), X.copy()
    y2[0] = 2
    X2[0] = rng.uniform(0, 10, size=6) + 2
    return (X, y), (X2, y2)


def _upload(h: Harness, owner: str, X: np.ndarray, y: np.ndarray) -> str:
    r = h.upload(
        owner,
        npz_bytes(X, y),
        feature_range=[0, 13],
        classes=CLASSES,
        budget=BUDGET,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _released(h: Harness, owner: str, body: dict[str, Any]) -> dict[str, Any]:
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    return done


def _answer(h: Harness, owner: str, body: dict[str, Any]) -> tuple[int, str]:
    """The preview's answer with the dataset's id taken out (the only thing allowed to differ)."""
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    text = r.text.replace(body["dataset_id"], "<dataset>")
    return r.status_code, text


def test_owner_only_outputs_and_class_counts_never_shape_what_is_published(
    embedded: Harness,
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    (X, y), (X2, y2) = _neighbours()
    a, b = _upload(h, owner, X, y), _upload(h, owner, X2, y2)
    held_out = h.upload(
        owner, npz_bytes(X2[::10], y2[::10]), feature_range=[0, 13], classes=CLASSES
    )
    assert held_out.status_code == 201, held_out.text

    # The same public history on both: one charged release. On `a` the owner also got the
    # non-DP utility report on held-out rows and a research release (claims, not bounds).
    first = {
        "mechanism": "dpmix",
        "params": {"mixture_degree": 4, "n_samples": 100},
        "epsilon": 2.0,
        "format": "npz",
    }
    _released(h, owner, {**first, "dataset_id": a, "report_test_dataset_id": held_out.json()["id"]})
    _released(h, owner, {**first, "dataset_id": b})
    research = {
        "dataset_id": a,
        "mechanism": "local_perturbation",
        "params": {},
        "epsilon": 8.0,
        "accountant": "paper",
        "research": True,
    }
    _released(h, owner, research)

    # Every served mechanism with its defaults (the parameters the service fills in), at a
    # target ε and with no δ (the default δ from the ledger): the same answer on both.
    for spec in registry.served():
        body = {"mechanism": spec.name, "params": {}, "epsilon": 1.0}
        answer_a = _answer(h, owner, {**body, "dataset_id": a})
        answer_b = _answer(h, owner, {**body, "dataset_id": b})
        assert answer_a == answer_b, spec.name
        assert answer_a[0] == 200, (spec.name, answer_a)

    # DP-CDA's default request is admitted on both neighbours with the same published
    # parameters, although their smallest classes differ.
    dpcda = {"mechanism": "dpcda", "params": {}, "epsilon": 1.0, "format": "npz"}
    made = [_released(h, owner, {**dpcda, "dataset_id": ds}) for ds in (a, b)]
    assert made[0]["params"] == made[1]["params"]
    assert made[0]["charge"] == made[1]["charge"]
