"""The dataset commands: ``upload``, ``idx-to-npz``, ``datasets``, ``grant``, ``grants``,
``revoke``, ``delete`` and ``budgets``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dprelease_cli.common import CliError, CliState, emit, pass_state, say
from dprelease_cli.options import json_option


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="Dataset name.")
@click.option("--label-column", help="CSV/Parquet: the column holding the labels.")
@click.option(
    "--feature-range",
    type=(float, float),
    metavar="LO HI",
    help="Public bounds for every feature.",
)
@click.option(
    "--feature-range-json",
    metavar="JSON",
    help="Per-column bounds, e.g. '{\"age\": [0, 120]}' (or a [lo, hi] list).",
)
@click.option(
    "--columns",
    "columns_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CSV/Parquet: a JSON file declaring every feature column (numeric with bounds, or "
    "categorical with its categories, each with an optional missing-value policy): "
    "docs/guide.md, Datasets. Instead of --feature-range.",
)
@click.option(
    "--classes",
    metavar="JSON_LIST",
    help="Declared label set, every class, e.g. '[0, 1]'. Without it the dataset takes no "
    "release (the labels in the file are private).",
)
@click.option("--epsilon", type=float, required=True, help="Total ε budget of the dataset.")
@click.option("--delta", type=float, required=True, help="δ of the dataset's budget.")
@pass_state
def upload(
    state: CliState,
    file: Path,
    name: str,
    label_column: str | None,
    feature_range: tuple[float, float] | None,
    feature_range_json: str | None,
    columns_file: Path | None,
    classes: str | None,
    epsilon: float,
    delta: float,
) -> None:
    """Upload a dataset FILE (npz, csv or parquet) with its public metadata and budget."""
    given = [feature_range, feature_range_json, columns_file]
    if sum(g is not None for g in given) != 1:
        raise click.UsageError(
            "give exactly one of --feature-range, --feature-range-json or --columns"
        )
    metadata: dict[str, Any] = {"name": name}
    if columns_file is not None:
        try:
            metadata["columns"] = json.loads(columns_file.read_text())
        except (OSError, ValueError) as exc:
            raise click.UsageError(f"--columns: {columns_file} is not JSON ({exc})") from exc
    else:
        metadata["feature_range"] = (
            list(feature_range)
            if feature_range is not None
            else json_option(feature_range_json, hint="--feature-range-json", kinds=(list, dict))
        )
    if label_column is not None:
        metadata["label_column"] = label_column
    declared = json_option(classes, hint="--classes", kinds=(list,))
    if declared is not None:
        metadata["classes"] = declared
    metadata["budget"] = {"epsilon": epsilon, "delta": delta}
    api = state.api()
    say(f"uploading {file} ({file.stat().st_size} bytes)")
    with file.open("rb") as fh:
        dataset = api.upload_dataset(fh, filename=file.name, metadata=metadata)
    clipped = dataset.get("clipped_values")
    if clipped:
        say(f"note: {clipped} feature values were outside feature_range and were clipped")
    if dataset.get("classes_declared_by_owner") is False:
        say(
            "note: no --classes declared: the labels found are shown to you only, and releases "
            "of this dataset are refused; upload it again with --classes to release from it"
        )
    emit(dataset)


@click.command("idx-to-npz")
@click.argument("images", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("labels", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
def idx_to_npz_command(images: Path, labels: Path, output: Path) -> None:
    """Convert IDX image and label files (e.g. MNIST, gzipped or not) to an NPZ with X and y
    (works offline)."""
    from dprelease_cli.idx import idx_to_npz

    try:
        payload = idx_to_npz(images, labels)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    output.write_bytes(payload)
    emit({"path": str(output), "bytes": len(payload)})


@click.command()
@click.argument("dataset_id", required=False)
@pass_state
def datasets(state: CliState, dataset_id: str | None) -> None:
    """List datasets, or show DATASET_ID."""
    api = state.api()
    emit(api.get_dataset(dataset_id) if dataset_id else api.list_datasets())


@click.command()
@click.argument("dataset_id")
@click.argument("principal_id")
@pass_state
def grant(state: CliState, dataset_id: str, principal_id: str) -> None:
    """Let PRINCIPAL_ID (an analyst) read and download the releases of DATASET_ID."""
    emit(state.api().grant(dataset_id, principal_id))


@click.command()
@click.argument("dataset_id")
@pass_state
def grants(state: CliState, dataset_id: str) -> None:
    """List the analysts granted DATASET_ID (owner, admin)."""
    emit(state.api().list_grants(dataset_id))


@click.command()
@click.argument("dataset_id")
@click.argument("grant_id")
@pass_state
def revoke(state: CliState, dataset_id: str, grant_id: str) -> None:
    """Revoke GRANT_ID of DATASET_ID: its analyst no longer sees the releases."""
    state.api().revoke_grant(dataset_id, grant_id)
    emit({"revoked": grant_id, "dataset_id": dataset_id})


@click.command()
@click.argument("dataset_id")
@click.option("--yes", is_flag=True, help="Confirm: the raw data is erased for good.")
@pass_state
def delete(state: CliState, dataset_id: str, yes: bool) -> None:
    """Delete DATASET_ID: erase its raw data; its ledger and releases stay (owner)."""
    if not yes:
        raise click.UsageError("deleting erases the raw data for good; add --yes to confirm")
    emit(state.api().delete_dataset(dataset_id))


@click.command()
@click.argument("dataset_id", required=False)
@pass_state
def budgets(state: CliState, dataset_id: str | None) -> None:
    """List budgets, or show the ledger of DATASET_ID."""
    api = state.api()
    result: dict[str, Any] = dict(api.get_budget(dataset_id) if dataset_id else api.list_budgets())
    # A line per dataset on stderr: what remains of ε and of δ (both budgets under the
    # ledger's filter); stdout keeps the JSON.
    for item in result.get("items") or [result]:
        say(_budget_line(item))
    emit(result)


def _budget_line(item: dict[str, Any]) -> str:
    def number(key: str, spec: str) -> str:
        value = item.get(key)
        return format(value, spec) if isinstance(value, int | float) else "?"

    name = item.get("dataset_name") or item.get("dataset_id")
    return (
        f"{name}: remaining ε = {number('remaining', '.6g')} of {number('epsilon', 'g')}, "
        f"δ = {number('delta_remaining', '.3g')} of {number('delta', 'g')}"
    )
