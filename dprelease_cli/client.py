"""The CLI's API client: :mod:`dprelease_client` (a light package of its own, so a script can
use it without the CLI or the server), re-exported for the CLI.

``ApiClient`` is a deprecated name of :class:`Client`: it still works, with a
``DeprecationWarning``; use ``Client``."""

import warnings
from typing import Any

from dprelease_client.client import TERMINAL_STATUSES, Client
from dprelease_client.errors import (
    ApiConnectionError,
    ApiError,
    ChecksumMismatch,
    ReleaseFailed,
    WaitTimeout,
)
from dprelease_client.transport import (
    DEFAULT_TIMEOUT,
    MAX_RETRY_WAIT_S,
    RATE_LIMIT_RETRIES,
    Download,
)


def __getattr__(name: str) -> Any:
    if name == "ApiClient":
        warnings.warn(
            "dprelease_cli.client.ApiClient is deprecated; use dprelease_client.Client",
            DeprecationWarning,
            stacklevel=2,
        )
        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RETRY_WAIT_S",
    "RATE_LIMIT_RETRIES",
    "TERMINAL_STATUSES",
    "ApiConnectionError",
    "ApiError",
    "ChecksumMismatch",
    "Client",
    "Download",
    "ReleaseFailed",
    "WaitTimeout",
]
