"""The console's pages and the offline /docs and /redoc, through the app (no browser: the
browser run is tests/integration/test_console_browser.py)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings
from service.console import docs

# An absolute URL in a src or href attribute, or any mention of the CDNs FastAPI defaults to.
_EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|jsdelivr|googleapis""", re.I)


@pytest.fixture(scope="module")
def client() -> TestClient:
    # No lifespan (no `with`): the pages and static files need no runtime.
    return TestClient(create_app(Settings.model_construct()))


@pytest.mark.parametrize(
    ("path", "assets"),
    [
        ("/docs", [docs.SWAGGER_JS, docs.SWAGGER_CSS, docs.SWAGGER_FAVICON]),
        ("/redoc", [docs.REDOC_JS]),
    ],
)
def test_docs_pages_load_only_vendored_assets(
    client: TestClient, path: str, assets: list[str]
) -> None:
    page = client.get(path)
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert not _EXTERNAL.search(page.text), page.text
    assert "/openapi.json" in page.text
    for asset in assets:
        assert asset in page.text
        r = client.get(asset)
        assert r.status_code == 200, asset
        assert len(r.content) > 500, asset


def test_swagger_ui_asks_no_online_validator(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text


def test_vendored_licenses_are_served_beside_the_bundles(client: TestClient) -> None:
    for path in ("swagger-ui/LICENSE", "swagger-ui/NOTICE", "redoc/LICENSE"):
        assert client.get(f"{docs.VENDOR_URL}/{path}").status_code == 200, path


def test_docs_routes_stay_out_of_the_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc", "/console"))]


def test_missing_static_file_is_a_json_404(client: TestClient) -> None:
    r = client.get(f"{docs.STATIC_URL}/nope.js")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
