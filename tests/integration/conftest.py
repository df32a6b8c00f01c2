"""Fixtures of the integration tests that live in their own modules."""

from tests.integration.console_browser import artifacts, browser, live

__all__ = ["artifacts", "browser", "live"]
