"""The errors the gateway answers itself (:class:`GatewayError`), in the shapes of
:mod:`wire.errors`; each counted in ``gateway_error_responses_total{status, code}`` and, for a
4xx, noted by :mod:`gateway.rejections`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from wire import errors as wire_errors
from wire.errors import error_response, validation_message
from wire.jsonsafe import StrictJSONResponse


class GatewayError(Exception):
    """An error the gateway answers itself, as ``status`` with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers


def parse_body(raw: bytes, model: type[BaseModel], what: str, *, optional: bool = False) -> Any:
    """``raw`` (a JSON request body) validated as ``model``; an empty body is ``model()`` when
    ``optional``. Raises :class:`GatewayError` (400, ``invalid_request``, ``param`` = the field)
    with :func:`wire.errors.validation_message`'s text otherwise."""
    if optional and not raw.strip():
        return model()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        message, param = validation_message(e.errors(include_url=False), what, model)
        raise GatewayError(400, message, code="invalid_request", param=param) from None


def count_error(request: Request, status: int, code: str | None, message: str = "") -> None:
    """Count an error the gateway answered itself and, for a 4xx, note the rejected call; a no-op
    when the app has no gateway state (e.g. during startup)."""
    gw = getattr(request.app.state, "gw", None)
    metrics = getattr(gw, "metrics", None)
    if metrics is not None:
        metrics.error_responses.labels(str(status), code or "").inc()
    rejections = getattr(gw, "rejections", None)
    if rejections is not None and 400 <= status < 500:
        rejections.note(
            method=request.method,
            path=request.url.path,
            status=status,
            reason=code,
            message=message,
            session_id=getattr(request.state, "session_id", None),
        )  # a session named by a header


def gateway_error_response(req: Request, exc: GatewayError) -> StrictJSONResponse:
    """The answer to a :class:`GatewayError`, counted."""
    count_error(req, exc.status, exc.code, exc.message)
    return error_response(req, exc.status, exc.message, code=exc.code, param=exc.param, headers=exc.headers)


def unexpected_error_response(req: Request, exc: Exception) -> StrictJSONResponse:
    """The 500 ``internal_error`` answer to a bug, counted."""
    count_error(req, 500, "internal_error")
    return wire_errors.unexpected_error_response(req, exc)


async def _gateway_error(req: Request, exc: Exception) -> StrictJSONResponse:
    assert isinstance(exc, GatewayError)
    return gateway_error_response(req, exc)


def install_error_handlers(app: Any) -> None:
    """:func:`wire.errors.install_error_handlers`, counted, and :class:`GatewayError` answered."""
    wire_errors.install_error_handlers(app, count=count_error)
    app.add_exception_handler(GatewayError, _gateway_error)
