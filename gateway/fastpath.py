"""The model-call endpoints served straight from ASGI, ahead of FastAPI's routing.

The six model-call ``POST`` paths (three protocols, per session and sessionless) skip FastAPI's
middleware stack, route matching and dependency solving (about a fifth of the gateway's CPU per
call in the benchmark's profile): :class:`ModelCallPaths` matches them with one regular
expression and :func:`serve` runs :func:`gateway.forward.handle` with the app's own error
handlers, so answers are the same either way. Every other request goes to FastAPI.
"""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError, gateway_error_response, unexpected_error_response
from gateway.forward import handle
from gateway.protocols import CHAT, MESSAGES, RESPONSES, WireProtocol
from gateway.state import GatewayState

log = logging.getLogger(__name__)

_PROTOCOLS: dict[str, WireProtocol] = {
    "chat/completions": CHAT,
    "responses": RESPONSES,
    "v1/messages": MESSAGES,
}


class ModelCallPaths:
    """Recognises the model-call paths of a gateway whose session paths start with
    ``base_session_path`` (e.g. ``/v1/sessions``):

    * ``{base}/{session_id}/chat/completions``, ``{base}/{session_id}/responses``,
      ``{base}/{session_id}/v1/messages`` (recorded);
    * ``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages`` (sessionless: recorded in the
      session a header names, else passthrough).

    A session id is one non-empty path segment of the ASGI ``path``, which the server has already
    percent-decoded (as FastAPI's path parameters see it; decoding again would make ``a%2541``
    the session ``aA`` here and ``a%41`` on the status and close routes)."""

    def __init__(self, base_session_path: str) -> None:
        base = re.escape(base_session_path.rstrip("/"))
        self._session = re.compile(base + r"/([^/]+)/(chat/completions|responses|v1/messages)")
        self._passthrough = {
            "/v1/chat/completions": CHAT,
            "/v1/responses": RESPONSES,
            "/v1/messages": MESSAGES,
        }

    def match(self, path: str) -> tuple[str | None, WireProtocol] | None:
        """``(session_id or None, protocol)`` for a model-call path, None for any other path."""
        proto = self._passthrough.get(path)
        if proto is not None:
            return None, proto
        m = self._session.fullmatch(path)
        if m is None:
            return None
        return m.group(1), _PROTOCOLS[m.group(2)]


async def serve(
    gw: GatewayState, session_id: str | None, proto: WireProtocol, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one model call on the raw ASGI connection (see the module docstring). A
    :class:`GatewayError` becomes its error answer; any other exception raised before the answer
    started is logged with its traceback and answered 500 ``internal_error`` (the same bodies
    as the app's exception handlers, :mod:`gateway.errors`); one raised while a stream is being
    sent propagates to the server, which closes the connection."""
    request = Request(scope, receive, send)
    response: Response
    try:
        response = await handle(gw, request, session_id, proto)
    except GatewayError as e:
        response = gateway_error_response(request, e)
    except Exception as e:
        log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
        response = unexpected_error_response(request, e)
    await response(scope, receive, send)


async def method_not_allowed(scope: Scope, receive: Receive, send: Send) -> None:
    """405 (``Allow: POST``) in the path's error shape, for another method on a model-call path."""
    request = Request(scope, receive, send)
    err = GatewayError(
        405,
        f"Method Not Allowed: {scope['method']} {scope['path']} takes POST only",
        headers={"Allow": "POST"},
    )
    await gateway_error_response(request, err)(scope, receive, send)
