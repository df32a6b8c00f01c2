"""The CLI's API client: :mod:`dprelease_client` (a light package of its own, so a script can
use it without the CLI or the server), re-exported under the names the CLI has always used."""

from dprelease_client.client import (
    DEFAULT_TIMEOUT,
    MAX_RETRY_WAIT_S,
    RATE_LIMIT_RETRIES,
    TERMINAL_STATUSES,
    ApiConnectionError,
    ApiError,
    ChecksumMismatch,
    Client,
    Download,
    ReleaseFailed,
    WaitTimeout,
)

ApiClient = Client

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RETRY_WAIT_S",
    "RATE_LIMIT_RETRIES",
    "TERMINAL_STATUSES",
    "ApiClient",
    "ApiConnectionError",
    "ApiError",
    "ChecksumMismatch",
    "Client",
    "Download",
    "ReleaseFailed",
    "WaitTimeout",
]
