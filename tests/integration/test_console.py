"""The console's pages and the offline /docs and /redoc, through the app (no browser: the
browser run is tests/integration/test_console_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

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
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    for asset in assets:
        assert asset in page.text
        r = client.get(asset)
        assert r.status_code == 200, asset
        assert len(r.content) > 500, asset


def test_swagger_ui_asks_no_online_validator(client: TestClient) -> None:
    page = client.get("/docs")
    assert '"validatorUrl": null' in page.text
    # Its one inline script runs by its hash (the browser test runs it under this policy).
    script = re.search(r"<script>(.*?)</script>", page.text, re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in page.headers["content-security-policy"]


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


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/console", "datasets"),
        ("/console/budgets", "budgets"),
        ("/console/datasets/d1", "dataset"),
    ],
)
def test_console_pages_render_shells_with_a_strict_policy(
    client: TestClient, path: str, page: str
) -> None:
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert f'data-page="{page}"' in r.text
    assert '<html lang="en">' in r.text
    assert 'role="alert"' in r.text
    assert '<label for="api-key">' in r.text
    assert not _EXTERNAL.search(r.text)
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["cache-control"] == "no-store"
    # The key field has no name: a form submitted without the script carries no key.
    field = re.search(r"<input[^>]*id=\"api-key\"[^>]*>", r.text, re.S)
    assert field is not None and "name=" not in field.group(0)
    for asset in ("/console/static/console.js", "/console/static/console.css"):
        assert asset in r.text
        assert client.get(asset).status_code == 200


def test_console_escapes_the_dataset_id_of_the_path(client: TestClient) -> None:
    r = client.get('/console/datasets/x"><img src=x onerror=alert(1)>')
    assert r.status_code == 200
    assert "<img src=x" not in r.text
    assert 'data-dataset-id="x&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text


def test_console_script_keeps_the_key_in_session_storage_only() -> None:
    script = (docs_dir() / "console.js").read_text()
    assert "sessionStorage" in script and "localStorage" not in script
    assert "Authorization: `Bearer ${storedKey()}`" in script


def docs_dir() -> Path:
    from service.console.endpoints import STATIC_DIR

    return STATIC_DIR


def test_console_pages_answer_405_with_their_methods(client: TestClient) -> None:
    """A form posted without the script (the key field has no name: no key in it) meets a
    405 naming GET, in the service's error shape."""
    r = client.post("/console", data={"x": "1"})
    assert r.status_code == 405
    assert r.headers["allow"] == "GET"
    assert r.json()["error"]["code"] == "method_not_allowed"
