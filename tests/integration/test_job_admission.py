"""Admission refuses what the job would refuse (issue 35, item 7): a noise the secure sampler
cannot draw over a mechanism's widest draw, and a kernel bandwidth whose Fourier features'
rounding the noise cannot cover, both found from public figures at preview and create
rather than by the job after it read the data (and was charged); and a job whose declared
work passes DPRELEASE_MAX_JOB_WORK (item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness, embedded_harness, npz_bytes, toy_dataset


def _both(h: Harness, key: str, body: dict[str, Any]) -> tuple[Any, Any]:
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(key))
    create = h.client.post("/releases", json=body, headers=h.headers(key))
    return preview, create


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 20.0, "delta": 1e-5})
    assert ds.status_code == 201, ds.text
    return owner, ds.json()["id"]


@pytest.mark.modes("embedded")
def test_a_noise_the_secure_sampler_cannot_draw_is_refused_at_admission(
    harness: Harness,
) -> None:
    """On main DPGM at σ = 1e10 passed preview and create, and its job failed at its first
    draw, charged (it had read the data)."""
    h = harness
    owner, ds = _dataset(h)
    body = {
        "dataset_id": ds,
        "mechanism": "dpgm",
        "params": {"epochs": 1, "n_samples": 10},
        "noise": {"sigma_x": 1e10},
    }
    for answer in _both(h, owner, body):
        assert answer.status_code == 422, answer.text
        message = answer.json()["error"]["message"]
        assert "secure sampler" in message and "noise_sampler 'fast'" in message, message
    # The fast sampler draws it: admitted.
    fast = {**body, "noise_sampler": "fast"}
    preview = h.client.post("/releases/preview", json=fast, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    # Noise the secure sampler draws is admitted as before.
    usual = {**body, "noise": {"sigma_x": 5.0}}
    preview = h.client.post("/releases/preview", json=usual, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text


@pytest.mark.modes("embedded")
@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("dpgm", {"clusters_per_class": 2, "rbf_width": 1e-7, "epochs": 1}),
        ("clustmix", {"feature_map": "rff", "clusters_per_class": 2, "rbf_width": 1e-12}),
    ],
)
def test_a_kernel_too_narrow_for_the_rounding_cover_is_refused_at_admission(
    harness: Harness, mechanism: str, params: dict[str, Any]
) -> None:
    """On main these passed admission, and the job failed at its first k-means step ("the
    rounding error must be ... below the unit"), after reading the data: charged."""
    h = harness
    owner, ds = _dataset(h)
    body = {"dataset_id": ds, "mechanism": mechanism, "params": params, "epsilon": 1.0}
    for answer in _both(h, owner, body):
        assert answer.status_code == 422, answer.text
        assert "rbf_width" in answer.json()["error"]["message"]
    wide = {**body, "params": {**params, "rbf_width": 0.5}}
    preview = h.client.post("/releases/preview", json=wide, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text


def test_a_job_past_the_work_cap_is_refused_naming_estimate_and_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On main a job of any length was admitted (DPGM for a day on MNIST). The cap is
    lowered here so that the toy table's long DPGM passes it and its short one does not."""
    with embedded_harness(tmp_path / "home", monkeypatch, max_job_work=1e10) as h:
        owner, ds = _dataset(h)
        long = {
            "dataset_id": ds,
            "mechanism": "dpgm",
            "params": {"epochs": 1000, "hidden": 4096},
            "epsilon": 1.0,
        }
        for answer in _both(h, owner, long):
            assert answer.status_code == 422, answer.text
            error = answer.json()["error"]
            assert error["code"] == "job_too_long"
            assert error["detail"]["limit_work"] == 1e10
            assert error["detail"]["estimated_work"] > 1e10
            assert "DPRELEASE_MAX_JOB_WORK" in error["message"]
        short = {**long, "params": {"epochs": 1, "hidden": 8}}
        preview = h.client.post("/releases/preview", json=short, headers=h.headers(owner))
        assert preview.status_code == 200, preview.text
