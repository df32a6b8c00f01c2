"""Mapping of typed errors to HTTP: one JSON shape, declared in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from service.errors import ServiceError


class ErrorBody(BaseModel):
    code: str
    message: str
    detail: dict[str, Any] = {}


class ErrorResponse(BaseModel):
    error: ErrorBody


_DESCRIPTIONS = {
    401: "Missing, malformed or unknown API key",
    403: "The key's role may not do this",
    404: "Not found (or not visible to this key)",
    409: "Conflict: the privacy budget would be exceeded, the release is not ready, the "
    "dataset was deleted, or releases of the dataset are still pending",
    410: "Erased: the object was deleted with the raw data it was computed from",
    413: "Request too large",
    422: "Invalid input; the message says what to fix",
}


def responses(*codes: int, **why: str) -> dict[int | str, dict[str, Any]]:
    """Error responses of an operation; ``why`` overrides a description, keyed ``e409=…``."""
    return {
        code: {"model": ErrorResponse, "description": why.get(f"e{code}", _DESCRIPTIONS[code])}
        for code in codes
    }


def _body(code: str, message: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(
            _body(exc.code, exc.message, exc.detail), status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        message = "; ".join(f"{'.'.join(p['loc'])}: {p['msg']}" for p in problems)
        return JSONResponse(
            _body("invalid_input", message or "invalid request", {"errors": problems}),
            status_code=422,
        )
