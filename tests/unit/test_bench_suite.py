"""bench/suite.py (``make bench``) in-process at tiny sizes: the JSON and Markdown it writes
carry the declared keys with positive figures, and a failing section is recorded while the
others still run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import mixing, suite

TINY = mixing.Sizes(n=400, d=784, classes=10, ells=(4,), rows=300, bandwidth_mib=8)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *only: str) -> dict[str, Any]:
    for name in suite.THREAD_VARIABLES:  # the suite sets them; restored after the test
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(mixing, "QUICK", TINY)
    out = tmp_path / "bench.json"
    argv = ["--quick", "--only", *only, "--out", str(out)]
    returned = suite.main([*argv, "--threads", str(torch.get_num_threads())])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    markdown = out.with_suffix(".md").read_text()
    assert "quick run" in markdown and written["command"] in markdown
    return written


def test_mixing_section_has_every_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: object) -> None:
        raise RuntimeError("this section broke")

    monkeypatch.setitem(suite.RUNNERS, "admission", broken)
    result = _run(tmp_path, monkeypatch, "mixing", "admission", "gpu")

    assert result["quick"] is True
    for key in ("cpu_model", "cpu_count", "memory_gib", "torch", "numpy", "torch_threads"):
        assert result["machine"][key] not in (None, ""), key
    assert result["machine"]["thread_env"]["OMP_NUM_THREADS"] == str(result["threads"])
    sections = result["sections"]
    assert sections["admission"]["status"] == "error"
    assert "this section broke" in sections["admission"]["error"]
    assert sections["gpu"]["status"] == "ok"
    if not torch.cuda.is_available():
        assert "no CUDA" in sections["gpu"]["result"]["skipped"]

    assert sections["mixing"]["status"] == "ok", sections["mixing"]
    mix = sections["mixing"]["result"]
    for key in ("numpy_read_gbs", "torch_read_gbs", "copy_gbs", "read_gbs"):
        assert _positive(mix["bandwidth"][key]), key
    by_name = {(c["mechanism"], c["ell"]): c for c in mix["cases"]}
    for base in ("baseline:numpy", "baseline:scipy_csr"):
        assert _positive(by_name[base, 4]["seconds"]) and _positive(
            by_name[base, 4]["effective_gbs"]
        )
    for mechanism in ("dpmix", "dpcda", "sgdrm"):
        for noise in ("fast", "kernel"):
            timed = by_name[mechanism, 4][noise]
            assert "error" not in timed, timed
            for key in ("seconds", "rows_per_s", "peak_rss_mib"):
                assert _positive(timed[key]), (mechanism, noise, key)
            assert timed["rows"] >= TINY.rows
            for key in ("effective_gbs", "ratio_to_read_bandwidth", "x_numpy", "x_scipy_csr"):
                assert _positive(timed[key]), (mechanism, noise, key)


@pytest.mark.slow
def test_noise_and_calibration_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(suite.NOISE_ROWS, "quick", 300)
    sections = _run(tmp_path, monkeypatch, "noise", "calibration")["sections"]
    assert sections["noise"]["status"] == "ok", sections["noise"]
    noise = sections["noise"]["result"]
    for key in (
        "secure_s",
        "fast_s",
        "ratio_secure_to_fast",
        "table_build_s",
        "secure_ns_per_entry",
    ):
        assert _positive(noise[key]), key
    assert noise["rows"] == 300 and noise["chunk_rows"] == 4096
    assert sections["calibration"]["status"] == "ok", sections["calibration"]
    cases = sections["calibration"]["result"]
    assert len(cases) == 2
    for case in cases:
        assert _positive(case["calibration_s"]) and _positive(case["one_evaluation_s"])
        assert case["achieved_epsilon"] <= case["target_epsilon"] * (1 + 1e-9)


def test_numpy_baseline_draws_uniform_subsets() -> None:
    import numpy as np

    drawn = mixing.subsets(np.random.default_rng(0), 30, 12, 2000)  # most first draws repeat
    assert drawn.shape == (2000, 12)
    assert all(len(set(row)) == 12 for row in drawn.tolist())
    counts = np.bincount(drawn.ravel(), minlength=30)  # every index equally likely
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()
