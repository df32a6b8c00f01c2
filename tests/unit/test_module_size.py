"""No production module grows past 600 lines: a module that long holds several jobs (split it
by job, as ClustMix's accountants are split into ``accounting`` and ``accounting_means``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "worker", "dpcore", "dprelease_cli", "dprelease_client")
LIMIT = 600


def test_no_production_module_is_over_the_limit() -> None:
    modules = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert len(modules) > 100  # the packages were found
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules}
    assert {path: n for path, n in sizes.items() if n > LIMIT} == {}
