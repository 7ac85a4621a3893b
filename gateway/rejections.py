"""Calls the gateway answers itself (no upstream call, no step): a missing or wrong key (401), an
unknown route (404), a closed session (409), a body too large (413), a malformed body (400),
another method (405), a synthetic stop at ``max_steps``.

Each is written to the request log and the gateway log, and counted per session by reason (the
error ``code``, e.g. ``invalid_api_key``, ``model_not_found``, ``max_steps``), so the session's
status and close answers show ``rejected_calls``. Counts live in this gateway process's memory
(bounded: the oldest sessions are dropped past :data:`MAX_SESSIONS`), never in the store.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from gateway.request_log import RequestLog

log = logging.getLogger(__name__)

MAX_SESSIONS = 100_000
"""Sessions whose counts are kept; the least recently rejected are dropped past it."""

_BY_STATUS = {
    400: "invalid_request",
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    422: "invalid_request",
}


class RejectedCalls:
    """Per-session counters of self-answered calls, plus their log lines. ``base_session_path``
    (e.g. ``/v1/sessions``) tells which session a path belongs to."""

    def __init__(self, base_session_path: str, request_log: RequestLog | None) -> None:
        self._prefix = base_session_path.rstrip("/") + "/"
        self._request_log = request_log
        self._counts: OrderedDict[str, dict[str, int]] = OrderedDict()

    def session_of(self, path: str) -> str | None:
        """The session id of a call path ``{base}/{sid}/...`` (not its ``close``), else None."""
        if not path.startswith(self._prefix):
            return None
        sid, sep, rest = path[len(self._prefix) :].partition("/")
        if not sid or not sep or not rest or rest == "close":
            return None
        return sid

    def note(
        self,
        *,
        method: str,
        path: str,
        status: int,
        reason: str | None,
        message: str,
        session_id: str | None = None,
        route: str | None = None,
    ) -> None:
        """Log and count one call answered ``status`` by the gateway. ``reason`` is the error
        code (None: named by the status); the session comes from ``session_id`` or the path."""
        why = reason or _BY_STATUS.get(status, f"http_{status}")
        sid = session_id if session_id is not None else self.session_of(path)
        if sid is not None:
            counts = self._counts.pop(sid, None) or {}
            counts[why] = counts.get(why, 0) + 1
            self._counts[sid] = counts
            if len(self._counts) > MAX_SESSIONS:
                self._counts.popitem(last=False)
        log.info(
            "answered by the gateway: %s %s -> %d %s (session %s): %s",
            method,
            path,
            status,
            why,
            sid or "none",
            message,
        )
        if self._request_log is not None:
            self._request_log.write_rejected(
                session_id=sid,
                route=route,
                method=method,
                path=path,
                http_status=status,
                reason=why,
                message=message,
            )

    def of(self, session_id: str) -> dict[str, int]:
        """The counts of ``session_id`` by reason (``{}`` when none)."""
        return dict(self._counts.get(session_id) or {})
