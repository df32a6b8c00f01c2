"""The console's pages: server-rendered shells (Jinja2) that the one script,
``static/console.js``, fills from the JSON API with the key kept in the browser's session
storage. The pages themselves carry no data and need no key: every figure on them is fetched
by the script with ``Authorization: Bearer <key>``, so the console sees exactly what the key
may see through the API, and a key never appears in a URL (docs/console.md).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from service.console import docs

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
TEMPLATES = Jinja2Templates(directory=HERE / "templates")

# The pages load nothing but the API's own files and call nothing but the API; no inline
# script or style, no framing, no referrer (a dataset id in the path stays here).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix="/console", include_in_schema=False)


def _object_store_origin(request: Request) -> str | None:
    """Where a download redirects the browser when the API answers downloads with presigned
    URLs (S3, ``download_mode`` ``presigned``): the scheme and host of such a URL, asked of
    the store's own presigner (a local computation: no request leaves), so the page may
    follow the redirect. None when downloads come from the API itself."""
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None or runtime.settings.download_mode != "presigned":
        return None
    url = runtime.store.presigned_url("releases/origin-probe", filename="probe")
    if url is None:  # the local store of embedded mode: the API serves the file
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _headers(request: Request) -> dict[str, str]:
    origin = _object_store_origin(request)
    if origin is None:
        return SECURITY_HEADERS
    policy = SECURITY_HEADERS["Content-Security-Policy"].replace(
        "connect-src 'self';", f"connect-src 'self' {origin};"
    )
    return {**SECURITY_HEADERS, "Content-Security-Policy": policy}


def _page(
    request: Request, template: str, title: str, page: str, **context: object
) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {"title": title, "page": page, "static": docs.STATIC_URL, **context},
        headers=_headers(request),
    )


@router.get("", response_class=HTMLResponse)
def datasets_page(request: Request) -> HTMLResponse:
    return _page(request, "datasets.html", "Datasets", "datasets")


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(request: Request, dataset_id: str) -> HTMLResponse:
    return _page(request, "dataset.html", "Dataset", "dataset", dataset_id=dataset_id)


@router.get("/budgets", response_class=HTMLResponse)
def budgets_page(request: Request) -> HTMLResponse:
    return _page(request, "budgets.html", "Budgets", "budgets")


@router.get("/releases/{release_id}", response_class=HTMLResponse)
def release_page(request: Request, release_id: str) -> HTMLResponse:
    return _page(request, "release.html", "Release", "release", release_id=release_id)


@router.get("/", response_class=RedirectResponse)
def console_slash() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request) -> HTMLResponse:
    return _page(request, "audit.html", "Audit trail", "audit")


@router.get("/datasets/{dataset_id}/new-release", response_class=HTMLResponse)
def new_release_page(request: Request, dataset_id: str) -> HTMLResponse:
    return _page(request, "new_release.html", "New release", "new_release", dataset_id=dataset_id)


def install(app: FastAPI) -> None:
    """Serve the console, its static files and the offline ``/docs`` and ``/redoc`` on
    ``app`` (built with ``docs_url=None, redoc_url=None``)."""
    app.mount(docs.STATIC_URL, StaticFiles(directory=STATIC_DIR), name="console-static")
    app.include_router(docs.router)
    app.include_router(router)
