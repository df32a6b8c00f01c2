"""Download settings (issue 14, item 5): presigned URLs are short-lived by default and bounded."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from service.config import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("DPRELEASE_")]:
        monkeypatch.delenv(var)


def test_defaults_are_presigned_urls_of_a_minute() -> None:
    settings = Settings()  # type: ignore[call-arg]
    assert settings.download_mode == "presigned"
    assert settings.s3_presign_seconds == 60


@pytest.mark.parametrize(
    "values",
    [
        {"s3_presign_seconds": 3601},  # a URL may not outlive a revocation by more than an hour
        {"s3_presign_seconds": 0},
        {"download_mode": "redirect"},
        {"download_chunk_bytes": 1024},
    ],
)
def test_out_of_bounds_values_are_refused(values: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**values)  # type: ignore[arg-type]


def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_DOWNLOAD_MODE", "stream")
    monkeypatch.setenv("DPRELEASE_S3_PRESIGN_SECONDS", "3600")
    settings = Settings()  # type: ignore[call-arg]
    assert (settings.download_mode, settings.s3_presign_seconds) == ("stream", 3600)
