"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from the vendored assets, not from a CDN.

FastAPI's own pages load their scripts from cdn.jsdelivr.net (and ReDoc its fonts from Google);
the app disables them (``docs_url=None, redoc_url=None``) and these routes, at the same paths,
render the same pages pointing at ``/console/static/vendor/`` (static/vendor/README.md says the
versions and how they were fetched).

Both pages answer with a Content-Security-Policy that admits the API's own origin only (and
the one inline script of Swagger UI's page, by its hash): ReDoc 2 draws the "API docs by
Redocly" footer with a logo from cdn.redoc.ly, which the policy stops before any request
leaves the browser (ReDoc then leaves the logo out).
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

STATIC_URL = "/console/static"
VENDOR_URL = f"{STATIC_URL}/vendor"
SWAGGER_JS = f"{VENDOR_URL}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{VENDOR_URL}/swagger-ui/swagger-ui.css"
SWAGGER_FAVICON = f"{VENDOR_URL}/swagger-ui/favicon-32x32.png"
REDOC_JS = f"{VENDOR_URL}/redoc/redoc.standalone.js"

router = APIRouter(include_in_schema=False)

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a policy that loads and calls nothing outside the API's origin. Inline
    styles stay allowed (both bundles inject their CSS); inline scripts only by hash."""
    html = bytes(page.body).decode()
    digests = (hashlib.sha256(s.encode()).digest() for s in _INLINE_SCRIPT.findall(html))
    hashes = " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)
    page.headers["Content-Security-Policy"] = (
        f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
        "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )
    page.headers["Referrer-Policy"] = "no-referrer"
    page.headers["X-Content-Type-Options"] = "nosniff"
    return page


def _openapi_url(request: Request) -> str:
    return str(request.app.openapi_url or "/openapi.json")


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    page = get_swagger_ui_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=SWAGGER_JS,
        swagger_css_url=SWAGGER_CSS,
        swagger_favicon_url=SWAGGER_FAVICON,
        # No badge fetched from validator.swagger.io: nothing leaves the API.
        swagger_ui_parameters={"validatorUrl": None},
    )
    return _with_policy(page)


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    page = get_redoc_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=REDOC_JS,
        redoc_favicon_url=SWAGGER_FAVICON,
        with_google_fonts=False,
    )
    return _with_policy(page)
