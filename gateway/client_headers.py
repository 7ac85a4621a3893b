"""The client's own correlation headers kept in a step's ``meta_json.client_headers``.

Only the names in :data:`CORRELATION_HEADERS` (an allow-list: ids a client or SDK sends to tie
its calls together, never credentials), each value cut to :data:`MAX_VALUE_CHARS`.
"""

from __future__ import annotations

from collections.abc import Mapping

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
