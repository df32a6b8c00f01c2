"""Issue 15's "Done when", end to end (real mode): a patients-style table (categorical
columns, gaps, a rare outcome) uploads with declared columns, releases with every served
mechanism in CSV, Parquet and NPZ, downloads in raw units under the original column names (the
label under its own), and ``dprelease evaluate`` reports ROC AUC on real held-out rows.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from dpcore.mechanisms import registry
from dprelease_cli.main import cli
from tests.conftest import Harness

FORMATS = ("csv", "parquet", "npz")
COLUMNS: list[dict[str, Any]] = [
    {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
    {"name": "ward", "type": "categorical", "categories": ["A", "B", "C", "D"]},
    {
        "name": "age",
        "type": "numeric",
        "bounds": [0, 100],
        "integer": True,
        "missing": {"policy": "indicator"},
    },
    {"name": "systolic", "type": "numeric", "bounds": [80, 200]},
    {
        "name": "lactate",
        "type": "numeric",
        "bounds": [0, 10],
        "missing": {"policy": "constant", "value": 1.5},
    },
]
FEATURES = [
    "sex=F",
    "sex=M",
    "ward=A",
    "ward=B",
    "ward=C",
    "ward=D",
    "age",
    "age_missing",
    "systolic",
    "lactate",
]
# Per mechanism, what a hospital team would set beyond the defaults: DP-CDA's class-size bound
# must hold for the rare outcome (the default, half a balanced class, is refused to the owner);
# DPGM's defaults train for minutes on a CPU.
PARAMS: dict[str, dict[str, Any]] = {
    # The rare outcome (≈ 60 of 1200): DP class counts (the default) would cost more than
    # ε = 4 at m = 30, and their bounds would miss it; this test is about formats and units.
    "dpcda": {"min_class_size": 30, "class_sizes": "declared"},
    "dpgm": {"hidden": 32, "epochs": 2.0},
    # Few planned rounds, two run (each fits and compiles the model anew), short fits: the
    # test's time, not the marginal mechanisms' quality (this test is about formats and units).
    "aim": {"iterations": 50, "rounds": 20, "max_rounds": 2},
    "mst": {"iterations": 50},
}


def patients(n: int, seed: int) -> pd.DataFrame:
    """Sex, ward (D declared but absent), age with 8 % gaps, systolic pressure, lactate with
    5 % gaps; the outcome (≈ 5 %) more likely with high lactate and pressure."""
    rng = np.random.default_rng(seed)
    systolic = np.clip(rng.normal(130, 18, n), 85, 195)
    lactate = np.clip(rng.gamma(2.0, 1.0, n), 0.1, 9.9)
    score = 1.1 * (lactate - 2) + 0.04 * (systolic - 130)
    p = 1 / (1 + np.exp(-(score - 4.0)))
    outcome = (rng.random(n) < p).astype(int)
    age = rng.integers(18, 95, size=n).astype(object)
    age[rng.random(n) < 0.08] = None
    lactate_col = lactate.round(2).astype(object)
    lactate_col[rng.random(n) < 0.05] = None
    return pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], size=n),
            "ward": rng.choice(["A", "B", "C"], size=n),
            "age": age,
            "systolic": systolic.round(1),
            "lactate": lactate_col,
            "outcome": outcome,
        }
    )


def _read(content: bytes, fmt: str) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """The release as a table under its own column names, and the metadata it carries."""
    if fmt == "csv":
        return pd.read_csv(io.BytesIO(content)), None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(content))
        return table.to_pandas(), json.loads(table.schema.metadata[b"dprelease"])
    with np.load(io.BytesIO(content)) as npz:
        meta = json.loads(str(npz["metadata"]))
        layout = meta["layout"]
        frame = pd.DataFrame(npz["X"], columns=layout["feature_columns"])
        return frame, meta


def _expected_columns(
    mechanism: str, meta: dict[str, Any], fmt: str
) -> tuple[list[str], list[str]]:
    """The uploaded columns (a table's CSV or Parquet release of rows in the declared
    domain), else the encoded feature names (an NPZ's X; a projection's own: p0, p1, …); and
    the label column under its own name — the class itself for exact labels, else one column
    per class."""
    kind = registry.get(mechanism).label_kind
    labels = ["outcome"] if kind == "exact" else ["outcome=0", "outcome=1"]
    if meta["transform"]["output"] == "mechanism":
        features = [f"p{i}" for i in range(len(meta["layout"]["feature_columns"]))]
        return features, labels
    if fmt != "npz" and "table_columns" in meta["layout"]:
        return [c["name"] for c in COLUMNS], labels
    return FEATURES, labels


def _check_table(frame: pd.DataFrame, where: Any) -> None:
    """Every value a valid category, an integer or an in-bounds number, or missing where the
    column's policy lets a missing entry show."""
    assert set(frame["sex"]) <= {"F", "M"}, where
    assert set(frame["ward"]) <= {"A", "B", "C", "D"}, where
    age = frame["age"].dropna()
    assert (age == age.round()).all() and age.between(0, 100).all(), where
    assert frame["systolic"].between(80, 200).all(), where
    assert frame["lactate"].between(0, 10).all(), where  # a constant policy: never missing


@pytest.mark.modes("real")
@pytest.mark.slow
def test_patients_table_every_mechanism_every_format_raw_units_and_auc(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    train, test = patients(1200, 0), patients(600, 1)
    assert 0.02 < train["outcome"].mean() < 0.1  # a rare outcome
    meta = {
        "name": "patients",
        "label_column": "outcome",
        "columns": COLUMNS,
        "classes": [0, 1],
        "budget": {"epsilon": 200, "delta": 1e-4},
    }
    r = h.upload(owner, train.to_csv(index=False).encode(), filename="patients.csv", metadata=meta)
    assert r.status_code == 201, r.text
    dataset = r.json()
    test_path = tmp_path / "test.csv"
    test.to_csv(test_path, index=False)
    real_age = pd.to_numeric(train["age"]).median()

    served = [s.name for s in registry.served()]
    assert {"dpmix", "dpcda", "sgdrm", "clustmix", "dpgm"} <= set(served)
    for i, mechanism in enumerate(served):
        for fmt in FORMATS:
            body = {
                "dataset_id": dataset["id"],
                "mechanism": mechanism,
                "params": PARAMS.get(mechanism, {}),
                "epsilon": 4.0,
                "format": fmt,
            }
            r = h.client.post("/releases", json=body, headers=h.headers(owner))
            assert r.status_code == 202, (mechanism, fmt, r.text)
            done = h.wait(owner, r.json()["id"], timeout=300)
            assert done["status"] == "succeeded", (mechanism, fmt, done)
            content = h.download(owner, done["id"])
            frame, carried = _read(content, fmt)
            metadata = carried or json.loads(h.download(owner, done["id"], "metadata.json"))
            features, labels = _expected_columns(mechanism, metadata, fmt)
            if fmt == "npz":
                assert list(frame.columns) == features, (mechanism, fmt)
            else:
                assert list(frame.columns) == features + labels, (mechanism, fmt)
            transform = metadata["transform"]
            assert transform["output"] in ("raw", "centred", "mechanism")
            if transform["output"] == "raw" and mechanism != "local_perturbation":
                # Raw units: the age column's median sits near the real one (a [0, 1]-scaled
                # release would put it near 0.5, 55 away), within its noise: the median's
                # standard error is about 1.25·std/√rows, and 5 of them plus 20 of bias (a
                # class-balanced or clipped release, or a generative model's: DPGM's VAE at
                # ε = 4 put it 11 below) is far below 55 whenever the values are on the [0, 1]
                # scale (std of a few units at most).
                # Released rows lie within the declared bounds; the noise law is read off the
                # owner's copy of the rows as drawn where the mapping changed them (clipping
                # keeps the std below the noise it hides).
                released_age = frame["age"].to_numpy(dtype=float)
                if fmt == "npz":
                    # The encoded rows: the indicator is 0 or 1; a missing age holds the
                    # upload's fill (the middle of its bounds: no fill declared).
                    gaps = frame["age_missing"].to_numpy(dtype=float)
                    assert set(np.unique(gaps)) <= {0.0, 1.0}, (mechanism, fmt)
                    assert (released_age[gaps == 1] == 50).all(), (mechanism, fmt)
                else:  # the table: a missing age is missing
                    _check_table(frame, (mechanism, fmt))
                    gaps = np.isnan(released_age).astype(float)
                assert gaps.mean() < 1, (mechanism, fmt)
                kept = gaps == 0
                assert released_age[kept].min() >= 0 and released_age[kept].max() <= 100
                drawn = h.as_drawn(owner, done["id"])
                age = released_age if drawn is None else _read(drawn, fmt)[0]["age"].to_numpy(float)
                # Clipped to the bounds, then rounded to a neighbouring whole number.
                gap = np.abs(np.clip(age, 0, 100)[kept] - released_age[kept])
                assert (gap < 1).all(), mechanism
                age = age[kept]
                assert not np.isnan(age).any()
                slack = 20 + 5 * 1.2533 * age.std() / math.sqrt(len(age))
                assert abs(np.median(age) - real_age) < slack, (mechanism, fmt, slack)
            if labels == ["outcome"] and fmt != "npz":
                assert set(frame["outcome"].unique()) <= {0, 1}
            # dprelease evaluate on every mechanism, one format each (round robin), reports AUC.
            if fmt != FORMATS[i % len(FORMATS)]:
                continue
            release_path = tmp_path / f"{mechanism}.{fmt}"
            release_path.write_bytes(content)
            args = ["evaluate", str(release_path), "--test", str(test_path)]
            args += ["--label-column", "outcome", "--classifier", "logistic"]
            if fmt == "csv":
                meta_path = tmp_path / f"{mechanism}.json"
                meta_path.write_text(json.dumps(metadata))
                args += ["--metadata", str(meta_path)]
            for where in metadata.get("arrays", {}).values():
                if fmt != "npz":  # a table release ships them as further files
                    array_path = tmp_path / where
                    array_path.write_bytes(h.download(owner, done["id"], where))
                    args += ["--array", str(array_path)]
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 0, (mechanism, fmt, result.output)
            report = json.loads(result.stdout)
            auc = report["roc_auc"]["logistic"]
            assert auc is not None and 0.0 <= auc <= 1.0, (mechanism, report)
            assert report["majority"]["balanced_accuracy"] == pytest.approx(0.5)
