"""The user guide's walkthrough with the CLI (docs/guide.md), against the real app (embedded
mode)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from dprelease_cli.main import CliState, cli
from tests.conftest import Harness, npz_bytes, toy_dataset


def test_cli_upload_release_download_budgets(embedded: Harness, tmp_path: Path) -> None:
    h = embedded
    created = h.cli(h.admin_key, "keys", "create", "--name", "alice", "--role", "owner")
    owner = created["key"]
    data = tmp_path / "toy.npz"
    data.write_bytes(npz_bytes(*toy_dataset()))
    ds = h.cli(
        owner,
        "upload",
        str(data),
        "--name",
        "toy",
        "--feature-range",
        "0",
        "13",
        "--classes",
        "[0, 1, 2]",
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
    )
    preview = h.cli(
        owner,
        "preview",
        ds["id"],
        "--mechanism",
        "dpmix",
        "-p",
        "mixture_degree=8",
        "-p",
        "n_samples=100",
        "--epsilon",
        "1",
    )
    assert preview["budget"]["admissible"] is True
    out = tmp_path / "release.npz"
    rel = h.cli(
        owner,
        "release",
        ds["id"],
        "--mechanism",
        "dpmix",
        "-p",
        "mixture_degree=8",
        "-p",
        "n_samples=100",
        "--epsilon",
        "1",
        "--output",
        str(out),
        "--poll-interval",
        "0.05",
    )
    assert rel["status"] == "succeeded"
    assert hashlib.sha256(out.read_bytes()).hexdigest() == rel["artifact"]["sha256"]
    assert np.load(out)["X"].shape == (100, 6)
    budgets = h.cli(owner, "budgets", ds["id"])
    assert [e["release_id"] for e in budgets["entries"]] == [rel["id"]]

    refused = CliRunner().invoke(
        cli,
        [
            "--url",
            "http://testserver",
            "--key",
            owner,
            "release",
            ds["id"],
            "--mechanism",
            "dpmix",
            "-p",
            "mixture_degree=8",
            "-p",
            "n_samples=100",
            "--epsilon",
            "3",
        ],
        obj=CliState(http=h.client),
    )
    assert refused.exit_code == 1
    assert "budget" in refused.stderr
