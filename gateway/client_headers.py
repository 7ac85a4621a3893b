"""The client's own headers the gateway reads: the correlation headers kept in a step's
``meta_json.client_headers``, and the session id of a sessionless call (docs/gateway.md,
"Sessions from a header").

Only the names in :data:`CORRELATION_HEADERS` are kept (an allow-list: ids a client or SDK
sends to tie its calls together, never credentials), each value cut to :data:`MAX_VALUE_CHARS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gateway.bodies import check_session_id
from gateway.errors import GatewayError

CORRELATION_HEADERS = (
    "x-claude-code-session-id",  # Claude Code: one id per CLI session
    "session-id",  # Codex CLI 0.171
    "thread-id",  # Codex CLI 0.171
    "x-codex-window-id",  # Codex CLI 0.171
    "session_id",  # older Codex CLI
    "conversation_id",  # older Codex CLI
    "x-client-request-id",  # Codex CLI, per request
    "x-request-id",
    "request-id",
    "x-correlation-id",
    "traceparent",  # W3C trace context
)
"""Header names kept (lowercase), in this order."""

MAX_VALUE_CHARS = 256


def correlation_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed headers present in ``headers`` (a case-insensitive mapping, as
    Starlette's), name -> value cut to :data:`MAX_VALUE_CHARS`; empty values left out."""
    out: dict[str, str] = {}
    for name in CORRELATION_HEADERS:
        value = headers.get(name)
        if value:
            out[name] = value[:MAX_VALUE_CHARS]
    return out


def session_from_headers(
    headers: Iterable[tuple[bytes, bytes]], names: Sequence[bytes]
) -> tuple[str, str] | None:
    """``(session id, header name)`` from the first of ``names`` (lowercase) that the raw ASGI
    ``headers`` carry, else None. The value is UTF-8 and must name a session as a path segment
    would: GatewayError 400 ``invalid_session_id`` otherwise, or when one header repeats with
    different values."""
    found: dict[bytes, set[bytes]] = {}
    for name, value in headers:
        if name in names:
            found.setdefault(name, set()).add(value)
    for name in names:
        values = found.get(name)
        if values is None:
            continue
        header = name.decode("latin-1")
        if len(values) > 1:
            raise GatewayError(
                400,
                f"header {header} is sent more than once with different values",
                code="invalid_session_id",
                param=header,
            )
        try:
            sid = (
                values.pop().decode("utf-8").strip(" \t")
            )  # a field value's surrounding whitespace is not its own
        except UnicodeDecodeError:
            raise GatewayError(
                400, f"header {header} is not UTF-8", code="invalid_session_id", param=header
            ) from None
        check_session_id(sid, where=f"header {header}")
        if "/" in sid or sid in (".", ".."):
            raise GatewayError(
                400,
                f"header {header}: a session id cannot contain '/' or be '.' or '..' (it must "
                "name the session in a session URL too)",
                code="invalid_session_id",
                param=header,
            )
        return sid, header
    return None
