"""The progress shown while :meth:`dprelease_client.Client.wait` polls: a callback, a tqdm bar
on stderr, or a line per change when tqdm is not installed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dprelease_client import types as t


def progress_reporter(
    release_id: str, progress: bool | Callable[[t.Release], None]
) -> Callable[[t.Release | None], None]:
    """``report(release)`` per state seen, ``report(None)`` once at the end."""
    if callable(progress):
        callback = progress
        return lambda release: None if release is None else callback(release)
    if not progress:
        return lambda release: None
    import sys

    try:
        from tqdm import tqdm
    except ImportError:  # a line on stderr per change, without tqdm
        seen: list[str] = []

        def line(release: t.Release | None) -> None:
            if release is None:
                return
            text = _describe(release)
            if not seen or seen[-1] != text:
                seen.append(text)
                print(f"release {release_id}: {text}", file=sys.stderr, flush=True)

        return line
    bar = tqdm(
        total=100,
        desc=f"release {release_id}",
        file=sys.stderr,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]{postfix}",
        dynamic_ncols=True,
    )

    def show(release: t.Release | None) -> None:
        if release is None:
            bar.close()
            return
        bar.n = round(_fraction(release) * 100)
        bar.set_postfix_str(_describe(release), refresh=False)
        bar.refresh()

    return show


def _fraction(release: Mapping[str, Any]) -> float:
    progress = release.get("progress")
    fraction = float(progress) if isinstance(progress, int | float) else 0.0
    if release.get("status") == "succeeded":
        fraction = 1.0
    return min(max(fraction, 0.0), 1.0)


def _describe(release: Mapping[str, Any]) -> str:
    status = release.get("status")
    phase = release.get("phase")
    # The phase is the job's word for its current step (rows written, training epochs, ...).
    return f"{status}: {phase}" if phase and status == "running" else str(status)
