"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Reference: OpenAI API reference, "Error codes"; the openai SDK reads ``error.message`` from this
body and maps the HTTP status to its exception classes (429/5xx are retried by the SDK).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None,
               type_: str | None = None) -> dict[str, Any]:
    """The JSON body of an OpenAI-shaped error for an HTTP status."""
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


class GatewayError(Exception):
    """An error the gateway answers itself, as ``status`` with an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers

    def response(self) -> JSONResponse:
        """This error as a JSONResponse."""
        return JSONResponse(error_body(self.status, self.message, code=self.code, param=self.param),
                            status_code=self.status, headers=self.headers)


async def _gateway_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return exc.response()


async def _http_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _validation_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    msg = f"{first.get('msg', 'invalid request')}" + (f" (at {loc})" if loc else "")
    return JSONResponse(error_body(400, msg, param=loc), status_code=400)


async def _unexpected_error(_req: Request, exc: Exception) -> JSONResponse:
    # Starlette's ServerErrorMiddleware calls this, then re-raises, so the server logs the traceback.
    return JSONResponse(error_body(500, f"internal gateway error: {type(exc).__name__}: {exc}",
                                   code="internal_error"), status_code=500)


def install_error_handlers(app: Any) -> None:
    """Make every error of the app answer in OpenAI's shape (404/405 of unknown paths included,
    and a 500 ``internal_error`` for a bug, whose traceback the server still logs)."""
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)
