"""The recommendations table and its lookup (issue 15.3): the shipped table loads, validates and
is fresh against the studies' CSVs; the lookup picks the nearest measured entry, adapts row
counts to the request's shape, falls back when a measured configuration is not admissible, and
reads no class counts."""

from __future__ import annotations

import csv
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import recommendations as builder
from dpcore.mechanisms import registry
from dpcore.mechanisms.recommend import (
    Measured,
    Shape,
    admissible,
    distance,
    load,
    nearest,
    recommend,
    recommend_all,
    table,
)
from dpcore.mechanisms.spec import PublicFacts

ROOT = Path(__file__).resolve().parents[2]


def _entry(**over: Any) -> Measured:
    raw: dict[str, Any] = {
        "dataset": "toy",
        "n": 1000,
        "d": 20,
        "classes": 2,
        "image": False,
        "epsilon": 1.0,
        "delta": 1e-3,
        "mechanism": "dpmix",
        "params": {"mixture_degree": 16, "n_samples": 1000},
        "metric": "accuracy",
        "models": ["logistic"],
        "score": 0.8,
        "spread": 0.01,
        "repeats": 3,
        "metrics": {"logistic_accuracy": 0.8},
        "candidates": 2,
        "source": "synthetic",
    }
    raw.update(over)
    return Measured.from_json(raw)


# --- the shipped table -------------------------------------------------------------------


def test_shipped_table_loads_validates_and_covers_the_studies() -> None:
    entries = table()
    datasets = {e.dataset for e in entries}
    assert {"breast_cancer", "digits", "wine", "make_classification", "mnist"} <= datasets
    served = {s.name for s in registry.served()}
    for e in entries:
        spec = registry.get(e.mechanism)
        assert e.mechanism in served
        # Every measured configuration is a valid request on the shape it was measured on.
        facts = PublicFacts(
            n=e.n,
            n_features=e.d,
            n_classes=e.classes,
            feature_shape=(28, 28) if e.image else (e.d,),
        )
        admissible(spec, e.params, replace(facts, class_counts=(e.n // e.classes,) * e.classes))
        assert e.metric in ("accuracy", "balanced_accuracy")
        assert 0 <= e.score <= 1 and e.spread >= 0
    mnist = [e for e in entries if e.dataset == "mnist"]
    assert mnist and all(e.image and e.n == 10_000 and e.d == 784 for e in mnist)


def test_shipped_table_is_fresh_against_the_csvs() -> None:
    """`python bench/recommendations.py --check`: regenerate the table when a study's CSV
    changes (this fails until then)."""
    assert builder.main(["--check"]) == 0


def test_stale_check_fails_when_a_csv_changes(tmp_path: Path) -> None:
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for name in ("tabular.csv", "sweet_spot.csv", "records_study.csv"):
        shutil.copy(ROOT / "docs" / "results" / name, results / name)
    assert builder.main(["--root", str(tmp_path), "--check"]) == 0
    # One measured accuracy changes: the best wine clustmix configuration's score moves.
    path = results / "tabular.csv"
    with path.open() as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    row = next(r for r in rows if r["dataset"] == "wine" and r["mechanism"] == "clustmix")
    row["logistic_accuracy"] = "0.123456"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields or [])
        writer.writeheader()
        writer.writerows(rows)
    assert builder.main(["--root", str(tmp_path), "--check"]) == 1
    # Written again, it is fresh.
    out = tmp_path / "table.json"
    assert builder.main(["--root", str(tmp_path), "--out", str(out)]) == 0
    assert builder.main(["--root", str(tmp_path), "--out", str(out), "--check"]) == 0


def test_records_study_mnist_rows_supersede_the_sweep_of_their_mechanisms(tmp_path: Path) -> None:
    from bench.tabular import DPGM_CHEAP

    assert builder.DPGM_CHEAP == DPGM_CHEAP
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for name in ("tabular.csv", "sweet_spot.csv"):
        shutil.copy(ROOT / "docs" / "results" / name, results / name)
    fields = ["dataset", "mechanism", "config", "epsilon", "note", "logistic", "hgb", "cnn"]
    with (results / "records_study.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        rows = [
            ["mnist", "dpcda", "defaults", "1.0", "", "0.5", "0.4", "0.6"],
            ["mnist", "dpgm", "cheap", "1.0", "", "0.7", "0.6", "0.8"],
            ["mnist", "dpmix", "defaults", "1.0", "refused", "", "", ""],
            ["wine", "dpmix", "defaults", "1.0", "", "0.9", "0.9", ""],
        ]
        writer.writerows(dict(zip(fields, row, strict=True)) for row in rows)
    out = tmp_path / "table.json"
    assert builder.main(["--root", str(tmp_path), "--out", str(out)]) == 0
    entries = json.loads(out.read_text())["entries"]
    mnist = {e["mechanism"]: e for e in entries if e["dataset"] == "mnist" and e["epsilon"] == 1.0}
    # The defaults at T = n replace the sweep's ℓ = 64 with 2 000 rows; DPGM's cheap settings.
    assert mnist["dpcda"]["params"] == {"n_samples": 10_000}
    assert mnist["dpcda"]["source"].endswith("records_study.csv")
    assert mnist["dpgm"]["params"] == {**DPGM_CHEAP, "n_samples": 10_000}
    # Not measured there (refused, or another dataset): the sweep's rows stay.
    assert mnist["dpmix"]["source"].endswith("sweet_spot.csv")
    assert not any(
        e["source"].endswith("records_study.csv") for e in entries if e["dataset"] == "wine"
    )


def test_records_study_table_rows_count_for_mechanisms_the_tabular_study_lacks(
    tmp_path: Path,
) -> None:
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "results" / "sweet_spot.csv", results / "sweet_spot.csv")
    # A tabular study without MST (the case the records study's rows stand in for).
    with (ROOT / "docs" / "results" / "tabular.csv").open() as source:
        table = list(csv.DictReader(source))
    with (results / "tabular.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(r for r in table if r["mechanism"] != "mst")
    fields = ["dataset", "mechanism", "config", "epsilon", "rows", "note", "logistic", "hgb"]
    with (results / "records_study.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        rows = [
            ["wine", "mst", "defaults", "1.0", "124", "", "0.5", "0.4"],
            ["wine", "mst", '{"structure": "label"}', "1.0", "124", "", "0.6", "0.5"],
            ["wine", "clustmix", "defaults", "1.0", "124", "", "0.9", "0.9"],
        ]
        writer.writerows(dict(zip(fields, row, strict=True)) for row in rows)
    out = tmp_path / "table.json"
    assert builder.main(["--root", str(tmp_path), "--out", str(out)]) == 0
    entries = json.loads(out.read_text())["entries"]
    mst = [e for e in entries if e["mechanism"] == "mst"]
    # Its own group, named by the study's private rows; the better configuration wins.
    assert [(e["dataset"], e["params"]) for e in mst] == [
        ("wine_n124", {"n_samples": 124, "structure": "label"})
    ]
    assert mst[0]["n"] == 124 and mst[0]["delta"] == pytest.approx(1 / 124**2)
    # ClustMix's table rows stay the tabular study's.
    assert not any(e["dataset"] == "wine_n124" for e in entries if e["mechanism"] != "mst")


def test_builder_ranks_by_mean_over_models_and_prefers_balanced_accuracy() -> None:
    """Balanced accuracy where every row has it; ties go to fewer params; spread over runs."""

    def run(mechanism: str, params: dict[str, Any], **values: float) -> dict[str, Any]:
        return {
            "dataset": "toy",
            "shape": (100, 5, 2, False),
            "epsilon": 1.0,
            "delta": 0.01,
            "mechanism": mechanism,
            "params": params,
            "values": {tuple(k.split("__")): v for k, v in values.items()},
            "source": "synthetic",
        }

    runs = [
        # By accuracy A wins; by balanced accuracy (present everywhere) B wins.
        run("dpmix", {"mixture_degree": 4}, a__accuracy=0.9, a__balanced_accuracy=0.5),
        run("dpmix", {"mixture_degree": 16}, a__accuracy=0.6, a__balanced_accuracy=0.7),
        run("dpmix", {"mixture_degree": 16}, a__accuracy=0.6, a__balanced_accuracy=0.6),
        # A tie: the configuration with fewer params wins.
        run(
            "dpcda",
            {"mixture_degree": 4, "postprocess": "none"},
            a__accuracy=1,
            a__balanced_accuracy=0.6,
        ),
        run("dpcda", {"mixture_degree": 4}, a__accuracy=1, a__balanced_accuracy=0.6),
    ]
    entries = {e["mechanism"]: e for e in builder.build(runs)["entries"]}
    assert entries["dpmix"]["params"] == {"mixture_degree": 16}
    assert entries["dpmix"]["metric"] == "balanced_accuracy"
    assert entries["dpmix"]["score"] == pytest.approx(0.65)
    assert entries["dpmix"]["spread"] == pytest.approx(0.1)
    assert entries["dpmix"]["repeats"] == 2 and entries["dpmix"]["candidates"] == 2
    assert entries["dpcda"]["params"] == {"mixture_degree": 4}
    # Without balanced accuracy in every row, accuracy ranks.
    runs[0]["values"].pop(("a", "balanced_accuracy"))
    entries = {e["mechanism"]: e for e in builder.build(runs)["entries"]}
    assert entries["dpmix"]["metric"] == "accuracy"
    assert entries["dpmix"]["params"] == {"mixture_degree": 4}


# --- the lookup ---------------------------------------------------------------------------


def test_nearest_wants_the_same_kind_then_the_smallest_distance() -> None:
    small = _entry(dataset="small", n=100)
    large = _entry(dataset="large", n=50_000)
    eps4 = _entry(dataset="small4", n=100, epsilon=4.0)
    image = _entry(dataset="img", n=120, image=True)
    entries = [small, large, eps4, image]
    shape = Shape(n=150, d=20, classes=2, image=False, epsilon=1.0)
    assert nearest(entries, "dpmix", shape)[0] is small  # type: ignore[index]
    assert nearest(entries, "dpmix", replace(shape, n=30_000))[0] is large  # type: ignore[index]
    assert nearest(entries, "dpmix", replace(shape, epsilon=3.0))[0] is eps4  # type: ignore[index]
    # The image entry is nearer in n, but only an image request gets it.
    found = nearest(entries, "dpmix", replace(shape, n=120, image=True))
    assert found is not None and found[0] is image and found[2] is True
    # No entry of the request's kind: the others, flagged.
    found = nearest([small], "dpmix", replace(shape, image=True))
    assert found is not None and found[0] is small and found[2] is False
    assert nearest(entries, "clustmix", shape) is None
    # Equal distance (ε 2 between 1 and 4): the smaller ε, whose configuration took more noise.
    tie = nearest([eps4, small], "dpmix", replace(shape, n=100, epsilon=2.0))
    assert tie is not None and tie[0] is small
    assert distance(shape, small) == pytest.approx(abs(math.log(1.5)))


def test_rows_keep_their_share_of_n_within_the_caps() -> None:
    spec = registry.get("dpmix")
    entry = _entry(params={"mixture_degree": 16, "n_samples": 500})  # half of n = 1000
    facts = PublicFacts(n=400, n_features=20, n_classes=2, max_release_rows=10_000)
    r = recommend(spec, facts, 1.0, [entry])
    assert r is not None and r.params == {"mixture_degree": 16, "n_samples": 200}
    assert r.resolved["n_samples"] == 200 and "n_samples 500 → 200" in r.why
    capped = recommend(spec, replace(facts, n=100_000, max_release_rows=3000), 1.0, [entry])
    assert capped is not None and capped.params["n_samples"] == 3000


def test_a_measured_configuration_that_is_not_admissible_falls_back() -> None:
    # projection_dim 10 on 4 features: refused by the check; the shape default is used.
    spec = registry.get("random_projection")
    entry = _entry(mechanism="random_projection", params={"projection_dim": 10})
    facts = PublicFacts(n=200, n_features=4, n_classes=2)
    r = recommend(spec, facts, 1.0, [entry])
    assert r is not None and r.params == {}
    assert r.resolved["projection_dim"] == 4
    assert "not admissible here" in r.why and "projection_dim 10" in r.why
    # dpcda ℓ = 16 on 20 rows: min_class_size 16 exceeds a balanced class of 10.
    dpcda = registry.get("dpcda")
    entry = _entry(mechanism="dpcda", params={"mixture_degree": 16, "n_samples": 1000})
    r = recommend(dpcda, PublicFacts(n=20, n_features=4, n_classes=2), 1.0, [entry])
    assert r is not None and r.params == {}
    admissible(dpcda, r.params, PublicFacts(n=20, n_features=4, n_classes=2, class_counts=(10, 10)))


def test_a_mechanism_with_no_admissible_configuration_is_left_out() -> None:
    """Local perturbation releases n rows: over the server's row cap nothing is admissible."""
    spec = registry.get("local_perturbation")
    entry = _entry(mechanism="local_perturbation", params={})
    facts = PublicFacts(n=10_000, n_features=20, n_classes=2, max_release_rows=5000)
    assert recommend(spec, facts, 1.0, [entry]) is None
    assert recommend(spec, replace(facts, max_release_rows=None), 1.0, [entry]) is not None


def test_a_mechanism_not_in_the_table_gets_its_defaults() -> None:
    r = recommend(registry.get("sgdrm"), PublicFacts(n=500, n_features=8, n_classes=2), 1.0, [])
    assert r is not None and r.params == {} and r.measured is None
    assert "not in the measured table" in r.why


def test_the_lookup_reads_no_class_counts() -> None:
    """The same recommendations whatever the (private) class counts say: a count of 1 would
    refuse dpcda's default min_class_size if it were read."""
    facts = PublicFacts(n=400, n_features=30, n_classes=2)
    plain = recommend_all(registry.served(), facts, 1.0)
    skewed = recommend_all(registry.served(), replace(facts, class_counts=(1, 399)), 1.0)
    assert [(r.mechanism, r.params, r.why) for r in plain] == [
        (r.mechanism, r.params, r.why) for r in skewed
    ]
    assert {r.mechanism for r in plain} == {s.name for s in registry.served()}


def test_the_table_file_is_the_packaged_one() -> None:
    raw = json.loads((ROOT / "dpcore" / "mechanisms" / "recommendations.json").read_text())
    assert raw["made_by"] == builder.COMMAND
    assert len(load()) == len(raw["entries"])


def test_builder_reads_the_extended_tabular_columns(tmp_path: Path) -> None:
    """The tabular study's later layout (n, d, classes and balanced accuracy columns, several
    ε, a make_classification variant): the columns win over the known shapes, and balanced
    accuracy ranks."""
    path = tmp_path / "tabular.csv"
    fields = [
        "dataset", "mechanism", "params", "epsilon", "delta", "n", "d", "classes",
        "logistic_accuracy", "logistic_balanced_accuracy", "logistic_auc",
    ]  # fmt: skip
    rows = [
        ["make_classification", "non-private", "", "inf", "0", "5000", "50", "2", "1", "1", "1"],
        ["make_classification", "dpmix", '{"mixture_degree": 4}', "0.5", "1e-8", "5000", "50",
         "2", "0.9", "0.5", "0.8"],
        ["make_classification", "dpmix", '{"mixture_degree": 16}', "0.5", "1e-8", "5000", "50",
         "2", "0.7", "0.6", "0.8"],
        ["make_classification_n500_d8", "dpmix", '{"mixture_degree": 4}', "4", "1e-6", "", "",
         "", "0.7", "0.6", "0.8"],
    ]  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        writer.writerows(rows)
    entries = builder.build(builder.tabular_runs(path))["entries"]
    assert len(entries) == 2  # the ε = ∞ reference is no candidate
    big, small = sorted(entries, key=lambda e: e["n"], reverse=True)
    assert (big["n"], big["d"], big["classes"], big["epsilon"]) == (5000, 50, 2, 0.5)
    assert big["metric"] == "balanced_accuracy"
    assert big["params"] == {"mixture_degree": 16, "n_samples": 5000}
    assert big["metrics"]["logistic_auc"] == 0.8
    assert (small["n"], small["d"], small["classes"]) == (500, 8, 2)


def test_a_target_the_public_count_noise_cannot_meet_keeps_the_defaults_admissible() -> None:
    """dpcda's DP class counts at the public count-noise rule (m/(4·6.1) = 4.05 at n = 398,
    K = 2, m = 99) cost ε 1.3 on their own; left out, count_noise is chosen for the target
    (``accounting.prepare``), so the defaults stay admissible at ε = 1 and dpcda is
    recommended. An explicit count noise the target cannot afford is still not admissible."""
    dpcda = registry.get("dpcda")
    facts = PublicFacts(n=398, n_features=30, n_classes=2)
    assert recommend(dpcda, facts, 1.0, delta=1e-5) is not None
    assert recommend(dpcda, facts, 4.0, delta=1e-5) is not None
    assert recommend(dpcda, facts, 1.0) is not None
    admissible(dpcda, {}, facts, (1.0, 1e-5))
    with pytest.raises(ValueError, match="alone cost ε"):
        admissible(dpcda, {"count_noise": 4.05}, facts, (1.0, 1e-5))
