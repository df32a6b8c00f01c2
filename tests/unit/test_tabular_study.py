"""bench/tabular.py, the tabular utility study (issue 15, item 6): its configurations (the
defaults as the service resolves them, the grid, --param/--sweep only where a mechanism has
the field), the mixed table's held-out rows encoded by the same declaration, refused
configurations kept as rows that say why, and the --quick run end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from bench import tabular, tabular_data
from dpcore.mechanisms import registry


def test_sweep_is_an_axis_only_where_the_params_model_has_the_field() -> None:
    plain = tabular.configs(["dpmix", "dpcda"], {}, {})
    swept = tabular.configs(["dpmix", "dpcda"], {}, {"min_class_size": [50, 100]})
    assert "min_class_size" in registry.get("dpcda").params.model_fields
    assert "min_class_size" not in registry.get("dpmix").params.model_fields
    dpmix = [c for c in swept if c.mechanism == "dpmix"]
    dpcda = [c for c in swept if c.mechanism == "dpcda"]
    assert dpmix == [c for c in plain if c.mechanism == "dpmix"]
    assert len(dpcda) == 2 * len([c for c in plain if c.mechanism == "dpcda"])
    assert sorted({c.request["min_class_size"] for c in dpcda}) == [50, 100]
    # The defaults configuration gives nothing but the swept value: the rest is resolved.
    assert {"min_class_size": 50} in [c.request for c in dpcda if c.config == "defaults"]


def test_every_served_mechanism_has_a_configuration_without_choices() -> None:
    plan = tabular.configs([s.name for s in registry.served()], {"postprocess": "none"}, {})
    first = {c.mechanism: c for c in reversed(plan)}
    assert set(first) == {s.name for s in registry.served()}
    for name, config in first.items():
        fields = registry.get(name).params.model_fields
        expected = dict(tabular.DPGM_CHEAP) if name == "dpgm" else {}
        if "postprocess" in fields:  # --param reaches only the models that have the field
            expected["postprocess"] = "none"
        assert config.request == expected


def test_the_mixed_tables_held_out_rows_take_the_declared_encoding() -> None:
    table = tabular_data.mixed(rows=1000)
    p = table.private
    assert table.X_test.shape == (300, p.n_features)
    names = p.feature_names
    for block in p.categorical_blocks:
        # One-hot over the declared categories in the held-out rows too (no category missing).
        assert np.all(table.X_test[:, list(block)].sum(axis=1) == 1)
    for column in ("x2", "x5"):  # indicator policy: a 0/1 feature marks the gaps
        flags = table.X_test[:, names.index(f"{column}_missing")]
        assert set(np.unique(flags)) <= {0.0, 1.0} and 0 < flags.mean() < 0.15
    assert np.all(table.X_test >= p.lo) and np.all(table.X_test <= p.hi)
    assert set(np.unique(table.y_test)) == {0, 1}


def test_a_configuration_the_service_refuses_is_a_row_saying_why() -> None:
    table = tabular_data.wine()
    # DP-CDA at ℓ = 64: min_class_size defaults to at least ℓ, more than wine's smallest class.
    config = tabular.Config("dpcda", "grid", {"mixture_degree": 64})
    row = tabular.run_one(table, config, 1.0, 1 / table.private.n_rows**2)
    assert row["note"] and "class" in row["note"]
    assert "logistic_auc" not in row
    assert json.loads(row["params"]) == {"mixture_degree": 64}


@pytest.mark.slow
def test_the_quick_study_runs_end_to_end(tmp_path: Path) -> None:
    # MST and AIM (the only mechanisms with these fields) fit briefly, AIM for two rounds:
    # each fit compiles its model anew, and their defaults took most of the run's time.
    quick = ["--param", "iterations=50", "--param", "max_rounds=2"]
    tabular.main(["--quick", *quick, "--out", str(tmp_path)])
    with (tmp_path / "tabular.csv").open() as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == tabular.FIELDS
        rows = list(reader)
    served = {s.name for s in registry.served()}
    for dataset in ("wine", "make_classification"):
        mine = [r for r in rows if r["dataset"] == dataset]
        assert {r["mechanism"] for r in mine} == served | {"non-private"}
        for r in mine:
            # The settings above are ones the service admits: MST and AIM ran.
            assert not (r["mechanism"] in ("mst", "aim") and r["note"]), r
            if r["note"]:
                continue
            for key in tabular.FIELDS[12:18]:
                assert 0.0 <= float(r[key]) <= 1.0, (r["mechanism"], key)
            if r["mechanism"] != "non-private":
                # Every charge is the ε asked for at δ = 1/n², never more.
                assert float(r["delta"]) == pytest.approx(1 / int(r["n"]) ** 2)
                assert float(r["charge"]) <= float(r["epsilon"]) * (1 + 1e-6)
    reference = next(r for r in rows if r["dataset"] == "wine" and r["mechanism"] == "non-private")
    assert float(reference["logistic_balanced_accuracy"]) > 0.8  # the models do learn
    table = (tmp_path / "tabular.md").read_text()
    assert "## Which mechanism wins where" in table and "### ε = 1" in table
    assert (tmp_path / "tabular.png").stat().st_size > 0


def test_a_grid_left_out_for_its_cost_is_a_row_saying_so() -> None:
    table = tabular_data.mixed(rows=15_000)  # 10 500 private rows: above SGDRM's grid limit
    assert table.private.n_rows > tabular.GRID_MAX_ROWS["sgdrm"]
    row = tabular.run_one(table, tabular.Config("sgdrm", "grid", {"mixture_width": 4}), 1.0, 1e-9)
    assert row["note"].startswith("not run: sgdrm's grid")
    assert "rows" not in row and "logistic_auc" not in row
    # Its defaults configuration is not left out.
    assert tabular.left_out(table, tabular.Config("sgdrm", "defaults")) == ""
