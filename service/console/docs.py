"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from the vendored assets, not from a CDN.

FastAPI's own pages load their scripts from cdn.jsdelivr.net (and ReDoc its fonts from Google);
the app disables them (``docs_url=None, redoc_url=None``) and these routes, at the same paths,
render the same pages pointing at ``/console/static/vendor/`` (static/vendor/README.md says the
versions and how they were fetched).
"""

from __future__ import annotations

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


def _openapi_url(request: Request) -> str:
    return str(request.app.openapi_url or "/openapi.json")


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=SWAGGER_JS,
        swagger_css_url=SWAGGER_CSS,
        swagger_favicon_url=SWAGGER_FAVICON,
        # No badge fetched from validator.swagger.io: nothing leaves the API.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=REDOC_JS,
        redoc_favicon_url=SWAGGER_FAVICON,
        with_google_fonts=False,
    )
