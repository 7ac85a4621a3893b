"""Reading a request: its body under a size limit, a JSON object, a model-call body validated
(:mod:`wire.requests`), a session id that can name a session."""

from __future__ import annotations

import json
import unicodedata
from typing import Any, TypeVar

from starlette.requests import Request

from gateway.errors import GatewayError
from wire.requests import InvalidRequest, WireRequest, validate_request

CONTROL_BODY_BYTES = 64 * 1024
"""The largest body of a control call (a session close, the admin endpoints): a few fields."""
CONTROL_LIMIT_NAME = "control body limit, fixed: a close or admin body holds a few fields"


async def read_body(request: Request, limit: int, limit_name: str = "max_request_bytes") -> bytes:
    """The whole request body, at most ``limit`` bytes (``limit_name``, the limit's name in the
    error message: the setting, or :data:`CONTROL_LIMIT_NAME`). Raises GatewayError(413,
    code ``request_too_large``) for a larger one, whether announced by ``Content-Length`` or
    found while reading a chunked body. The rest of an oversized body is read and discarded
    (not kept in memory) before the 413 is sent, so the client, still sending, gets the answer
    instead of a connection reset; except when ``Content-Length`` announces more than twice the
    limit: then the 413 is sent at once (a client announcing a body it never sends would
    otherwise hold the connection)."""
    parts: list[bytes] = []
    size = 0
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    if over and int(declared) > 2 * limit:
        raise GatewayError(
            413,
            f"request body ({declared} bytes announced) is larger than the gateway's limit of "
            f"{limit} bytes ({limit_name})",
            code="request_too_large",
        )
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
        if not over:
            parts.append(chunk)
    if over:
        raise GatewayError(
            413,
            f"request body is larger than the gateway's limit of {limit} bytes ({limit_name})",
            code="request_too_large",
        )
    return b"".join(parts)


async def read_control_body(request: Request) -> bytes:
    """The body of a control call, at most :data:`CONTROL_BODY_BYTES` (413 naming that limit)."""
    return await read_body(request, CONTROL_BODY_BYTES, CONTROL_LIMIT_NAME)


MAX_SESSION_ID_CHARS = 128  # the width of the session_id columns (store.models)


def check_session_id(session_id: str, where: str = "") -> str:
    """``session_id`` when it can name a session: 1 to :data:`MAX_SESSION_ID_CHARS` characters,
    none of them a control character (Unicode category Cc: NUL, CR, LF, ... cannot go into the
    ``X-Session-Id`` header or a per-session upstream URL) or a format character (Cf: bidi overrides,
    zero-width marks make look-alike ids). Raises GatewayError(400, code
    ``invalid_session_id``, the message prefixed by ``where``) otherwise, before any budget is used."""
    pre = f"{where}: " if where else ""
    param = where.removeprefix("header ") if where else None
    if not session_id.strip():
        raise GatewayError(
            400,
            f"{pre}session id {session_id!r} is empty or only whitespace",
            code="invalid_session_id",
            param=param,
        )
    if len(session_id) > MAX_SESSION_ID_CHARS:
        raise GatewayError(
            400,
            f"{pre}session id must be 1 to {MAX_SESSION_ID_CHARS} characters, got {len(session_id)}",
            code="invalid_session_id",
            param=param,
        )
    if not session_id.isprintable() and any(unicodedata.category(c) in ("Cc", "Cf") for c in session_id):
        raise GatewayError(
            400,
            f"{pre}session id {session_id!r} contains a control or format character",
            code="invalid_session_id",
            param=param,
        )
    return session_id


MAX_BODY_DEPTH = 128
"""The deepest a request body may nest objects and arrays: a recorded step must stay readable by
every reader of the store (pydantic serializes at most 255 levels)."""


_TOO_DEEP = object()


def _too_deep(body: object, limit: int) -> bool:
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((v, depth + 1) for v in inner if isinstance(v, dict | list))
    return False


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object. Raises GatewayError(400) otherwise
    (empty, not JSON, not an object, or nested deeper than :data:`MAX_BODY_DEPTH`)."""
    if not raw:
        raise GatewayError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise GatewayError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:
        body = _TOO_DEEP
    if body is _TOO_DEEP or (
        raw.count(b"[") + raw.count(b"{") > MAX_BODY_DEPTH and _too_deep(body, MAX_BODY_DEPTH)
    ):
        raise GatewayError(400, f"request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)")
    if not isinstance(body, dict):
        raise GatewayError(400, f"request body must be a JSON object, not {type(body).__name__}")
    return body


R = TypeVar("R", bound=WireRequest)


def validate_body(model: type[R], body: dict[str, Any]) -> R:
    """:func:`wire.requests.validate_request`, its failure a GatewayError(400) naming the field."""
    try:
        return validate_request(model, body)
    except InvalidRequest as e:
        raise GatewayError(400, str(e), param=e.param) from None
