"""Optional JSONL request log (``request_log`` in the gateway config).

One JSON line per call: time, session, route, endpoint, HTTP status, step status, latency, and the
request/response bodies with secrets removed and cut to ``body_limit_bytes`` (UTF-8 bytes of their
JSON text; a cut body is logged as ``{"truncated": true, "prefix": "..."}``); a call the gateway
answered itself has ``rejected`` (its reason), ``method``, ``path`` and ``message`` instead. Files rotate by size
(``max_bytes``, ``backup_count``) with the standard library's RotatingFileHandler; lines are
written by a background thread (QueueHandler/QueueListener) so the event loop never waits on disk.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import time
from pathlib import Path
from typing import Any

from gateway.redact import redact
from gateway.settings import RequestLogSettings
from wire.text import json_text


class RequestLog:
    """Writer of the request log; ``start()`` / ``stop()`` around the app's life."""

    def __init__(self, settings: RequestLogSettings) -> None:
        self.settings = settings
        self._listener: logging.handlers.QueueListener | None = None
        self._logger = logging.getLogger(f"gateway.request_log.{id(self)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)

    def start(self) -> None:
        """Open the log file (creating its folder) and start the writer thread."""
        path = Path(self.settings.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=self.settings.max_bytes, backupCount=self.settings.backup_count, encoding="utf-8"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        q: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._logger.addHandler(logging.handlers.QueueHandler(q))
        self._listener = logging.handlers.QueueListener(q, handler)
        self._listener.start()

    def stop(self) -> None:
        """Flush pending lines and close the file."""
        if self._listener is not None:
            self._listener.stop()
            for h in list(self._listener.handlers):
                h.close()
            self._listener = None
        for h in list(self._logger.handlers):
            self._logger.removeHandler(h)

    def _cut(self, body: Any) -> Any:
        text = json_text(redact(body), default=str)
        limit = self.settings.body_limit_bytes
        raw = text.encode()
        if len(raw) <= limit:
            return json.loads(text)
        return {"truncated": True, "bytes": len(raw), "prefix": raw[:limit].decode("utf-8", "ignore")}

    def write(
        self,
        *,
        session_id: str | None,
        route: str,
        endpoint: str,
        http_status: int,
        step_status: str | None,
        latency_ms: float,
        request: Any,
        response: Any,
    ) -> None:
        """Log one call (no-op before ``start()``)."""
        if self._listener is None:
            return
        line = {
            "ts": time.time(),
            "session_id": session_id,
            "route": route,
            "endpoint": endpoint,
            "http_status": http_status,
            "step_status": step_status,
            "latency_ms": round(latency_ms, 3),
            "request": self._cut(request),
            "response": self._cut(response),
        }
        self._logger.info(json_text(line, default=str))

    def write_rejected(
        self,
        *,
        session_id: str | None,
        route: str | None,
        method: str,
        path: str,
        http_status: int,
        reason: str,
        message: str,
    ) -> None:
        """Log one call the gateway answered itself (:mod:`gateway.rejections`): no step, so
        ``step_status`` is null and ``rejected`` names the reason; no bodies."""
        if self._listener is None:
            return
        line = {
            "ts": time.time(),
            "session_id": session_id,
            "route": route,
            "method": method,
            "path": path,
            "http_status": http_status,
            "step_status": None,
            "rejected": reason,
            "message": message[:500],
        }
        self._logger.info(json_text(line, default=str))
