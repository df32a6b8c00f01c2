"""A light Python client for the dprelease API: httpx only at import (no numpy, pandas or
torch), typed methods for every operation, :meth:`Client.wait` with progress and
:meth:`Client.to_pandas` for releases. See docs/guide.md, "Python client"."""

from dprelease_client.client import TERMINAL_STATUSES, Client
from dprelease_client.errors import (
    ApiConnectionError,
    ApiError,
    ChecksumMismatch,
    ReleaseFailed,
    WaitTimeout,
)
from dprelease_client.frames import read_release
from dprelease_client.transport import Download

__all__ = [
    "TERMINAL_STATUSES",
    "ApiConnectionError",
    "ApiError",
    "ChecksumMismatch",
    "Client",
    "Download",
    "ReleaseFailed",
    "WaitTimeout",
    "read_release",
]
