"""Error bodies: OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, Anthropic's
(``{"type": "error", "error": {"type", "message"}}``) on every Anthropic Messages path, or the
shape an endpoint set for its request (:func:`set_error_shape`); and the FastAPI handlers that
answer every error of an app in them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from wire.jsonsafe import StrictJSONResponse

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


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None, type_: str | None = None
) -> dict[str, Any]:
    """The JSON body of an OpenAI-shaped error for an HTTP status."""
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


_SOURCES = {"query": "query parameter", "header": "header", "path": "path parameter", "body": "field"}


_SHORT = {"missing": "required", "extra_forbidden": "unknown"}


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _place(err: Any, request: bool) -> tuple[str, str | None]:
    """(what kind of input, its dotted name) of one error; ``request``: FastAPI's errors, whose
    ``loc`` starts with where the input came from (query, header, path, body)."""
    loc = [str(x) for x in err.get("loc", ())]
    kind = "field"
    if request and loc and loc[0] in _SOURCES:
        kind, loc = _SOURCES[loc[0]], loc[1:]
    return kind, ".".join(loc) or None


def validation_message(
    errors: list[Any], what: str, model: type[BaseModel] | None = None, *, request: bool = False
) -> tuple[str, str | None]:
    """A clear message for pydantic validation ``errors`` of ``what`` (e.g. ``"invalid
    /admin/pause body"``), and the field at fault (the error's ``param``; None when the whole
    input is wrong). It names the first field at fault, the rule it broke and the value it got;
    ``model`` lists the known fields when an unknown one was sent. ``request``: the errors are
    FastAPI's ``RequestValidationError.errors()`` (query parameters, headers, body fields)."""
    if not errors:
        return what, None
    first = errors[0]
    kind, field = _place(first, request)
    etype, msg = first.get("type", ""), first.get("msg", "invalid")
    if field is None:
        text = (
            f"{what}: not valid JSON ({(first.get('ctx') or {}).get('error', msg)})"
            if etype == "json_invalid"
            else f"{what}: {msg}"
        )
    elif etype == "missing":
        text = f"{what}: {kind} '{field}' is required"
    elif etype == "extra_forbidden":
        known = f" (known: {', '.join(sorted(model.model_fields)) or 'none'})" if model is not None else ""
        text = f"{what}: unknown {kind} '{field}'{known}"
    else:
        text = f"{what}: {kind} '{field}': {msg} (got {_got(first.get('input'))})"
    others = sorted(
        {
            f"'{name}' ({_SHORT.get(e.get('type', ''), 'invalid')})"
            for e in errors[1:]
            if (name := _place(e, request)[1]) and name != field
        }
    )
    if others:
        text += f"; also: {', '.join(others)}"
    return text, field


# (HTTP status, OpenAI-shaped error body) -> the body in the endpoint's own error shape
ErrorShape = Callable[[int, dict[str, Any]], dict[str, Any]]

ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error ``type`` per HTTP status (API reference, "Errors"); another 4xx is
``invalid_request_error``, another 5xx ``api_error``."""


def anthropic_error(status: int, err: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body (:func:`error_body`) in Anthropic's shape:
    ``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    inner = err.get("error")
    message = inner.get("message") if isinstance(inner, dict) else None
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": str(message)}}


def is_anthropic_path(path: str) -> bool:
    """True for an Anthropic Messages path: ``.../v1/messages`` or under it (``count_tokens``,
    an unknown sub-path), sessionless or per session."""
    return path.endswith("/v1/messages") or "/v1/messages/" in path


def set_error_shape(request: Request, shape: ErrorShape) -> None:
    """Answer every later error of ``request`` in the shape ``shape`` builds (it gets the HTTP
    status and the OpenAI-shaped body). Kept in the ASGI scope's state, which the exception
    handlers of the app see."""
    request.state.error_shape = shape


def shaped(path: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (OpenAI's shape) in the error shape of ``path``: Anthropic's on an Anthropic
    Messages path, else unchanged."""
    return anthropic_error(status, body) if is_anthropic_path(path) else body


def request_shaped(request: Request, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` in ``request``'s error shape: the one set by :func:`set_error_shape`, else its path's."""
    shape: ErrorShape | None = getattr(request.state, "error_shape", None)
    return shaped(request.url.path, status, body) if shape is None else shape(status, body)


ErrorCounter = Callable[[Request, int, str | None, str], None]
"""Told of each error answered: (request, HTTP status, code, message)."""


def error_response(
    req: Request,
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> StrictJSONResponse:
    """An error answer to ``req``, its body in the request's error shape."""
    body = error_body(status, message, code=code, param=param)
    return StrictJSONResponse(request_shaped(req, status, body), status_code=status, headers=headers)


def install_error_handlers(app: Any, count: ErrorCounter | None = None) -> None:
    """Answer every error of ``app`` in its request's error shape: HTTP errors (unknown paths,
    405s), invalid parameters (a 400 naming the first one) and a bug (a 500 ``internal_error``,
    whose traceback the server still logs). ``count`` is told of each."""

    def counted(req: Request, status: int, code: str | None, message: str) -> None:
        if count is not None:
            count(req, status, code, message)

    async def http_error(req: Request, exc: Exception) -> StrictJSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        counted(req, exc.status_code, None, str(exc.detail))
        return error_response(req, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    async def invalid(req: Request, exc: Exception) -> StrictJSONResponse:
        assert isinstance(exc, RequestValidationError)
        msg, param = validation_message(
            list(exc.errors()), f"invalid request to {req.url.path}", request=True
        )
        counted(req, 400, "invalid_request", msg)
        return error_response(req, 400, msg, code="invalid_request", param=param)

    async def unexpected(req: Request, exc: Exception) -> StrictJSONResponse:
        # Starlette's ServerErrorMiddleware calls this, then re-raises: the server logs the traceback.
        counted(req, 500, "internal_error", "")
        return unexpected_error_response(req, exc)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, unexpected)


def unexpected_error_response(req: Request, exc: Exception) -> StrictJSONResponse:
    """The 500 ``internal_error`` answer to a bug, in the request's error shape."""
    return error_response(req, 500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
