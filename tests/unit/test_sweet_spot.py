"""bench/sweet_spot.py trains on a release as the service serves it: post-processed when the
request asks for it, not the raw noisy rows."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from bench import sweet_spot
from service.datasets.parsing import parse_dataset
from service.datasets.schemas import Budget, DatasetMetadata


def _images(n: int = 400) -> Any:
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(n, 6, 6)).astype(np.uint8)
    y = np.arange(n) % 2
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y)
    meta = DatasetMetadata(
        name="tiny", feature_range=(0, 255), classes=[0, 1], budget=Budget(epsilon=10, delta=1e-5)
    )
    return parse_dataset(
        content=buffer.getvalue(), filename="t.npz", metadata=meta, max_bytes=10**7
    )


@pytest.mark.parametrize(("postprocess", "clipped"), [("denoise", False), ("none", True)])
def test_the_study_evaluates_the_rows_as_released(
    monkeypatch: pytest.MonkeyPatch, postprocess: str, clipped: bool
) -> None:
    seen: dict[str, np.ndarray] = {}

    def fake_evaluate(release: Any, X: Any, y: Any, **_: Any) -> dict[str, Any]:
        seen["X"] = release.X
        return {"accuracy": {"linear": 0.5}, "seconds": {"linear": 0.0}}

    monkeypatch.setattr(sweet_spot, "evaluate", fake_evaluate)
    parsed = _images()
    test = (np.zeros((4, 6, 6)), np.zeros(4, dtype=int))
    sweet_spot.run_one(
        "dpcda",
        1.0,
        4,
        parsed,
        test,
        families=["linear"],
        extra={"postprocess": postprocess},
        epochs=1,
        noise_sampler="fast",
    )
    X = seen["X"]
    # Released rows lie in the public domain (declared bounds, in raw units as the release is
    # served): denoised, or the noisy rows at ε = 1 clipped into it, a third of the values
    # and more at a bound.
    lo, hi = parsed.lo, parsed.hi
    assert bool(((lo <= X) & (hi >= X)).all())
    assert bool(np.isin(X, [lo[0], hi[0]]).mean() > 0.3) is clipped


def test_rows_with_other_request_params_are_their_own_series(tmp_path: Any) -> None:
    """One mechanism run with and without a --param (post-processing, say): the table and the
    best-of table keep the two apart instead of mixing them into one series."""
    families = ["linear"]
    base = {"mechanism": "dpcda", "epsilon": 1.0, "sigma_x": 0.3, "charge": 1.0, "seconds": 1}
    rows = [
        {**base, "ell": "4", "params": "", "linear": 0.5, "linear_s": 0.1},
        {
            **base,
            "ell": "4",
            "params": '{"postprocess": "denoise"}',
            "linear": 0.7,
            "linear_s": 0.1,
        },
    ]
    sweet_spot.write_outputs(tmp_path, rows, "cmd", families, tmp_path / "none.csv")
    table = (tmp_path / "sweet_spot.md").read_text()
    assert "| dpcda | 1 | 4 | 0.3 | 1.0000 | 0.500 |" in table
    assert "| dpcda (postprocess=denoise) | 1 | 4 | 0.3 | 1.0000 | 0.700 |" in table
    assert "| dpcda | 1 | 0.500 (ℓ = 4) |" in table
    assert "| dpcda (postprocess=denoise) | 1 | 0.700 (ℓ = 4) |" in table
    assert (tmp_path / "sweet_spot.png").stat().st_size > 0
