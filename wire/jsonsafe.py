"""Strict JSON toward the client: each ``NaN``/``Infinity``/``-Infinity`` an upstream sends becomes
``null``, in bodies and SSE events alike (docs/gateway-semantics.md, "Strict JSON")."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse

from wire.sse import SSEEvent
from wire.text import json_text

_LINE = re.compile(rb"\r\n|\r|\n")


def loads_strict(text: str | bytes) -> tuple[Any, int]:
    """``json.loads(text)`` with every ``NaN``/``Infinity``/``-Infinity`` read as None; returns the
    value and how many were replaced. Raises ValueError for text that is not JSON."""
    replaced = 0

    def _null(_name: str) -> None:
        nonlocal replaced
        replaced += 1

    return json.loads(text, parse_constant=_null), replaced


def compact(obj: Any) -> str:
    """Compact strict JSON text (no spaces, UTF-8 kept; all ``\\uXXXX`` escapes when a string
    holds a lone surrogate: :func:`wire.text.json_text`)."""
    return json_text(obj, separators=(",", ":"), allow_nan=False)


class StrictJSONResponse(JSONResponse):
    """A JSON response the gateway writes itself (its errors, synthetic answers): starlette's
    compact JSON, with ``\\uXXXX`` escapes when a string holds a lone surrogate (a client's model
    name or an upstream's message echoed), so such a body is never a 500."""

    def render(self, content: Any) -> bytes:
        return json_text(content, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


def may_hold_non_finite(raw: bytes) -> bool:
    """A cheap pre-check: False when ``raw`` certainly holds no non-finite number."""
    return b"NaN" in raw or b"Infinity" in raw


def strict_event(ev: SSEEvent) -> tuple[SSEEvent, int]:
    """``ev`` with its JSON data made strict (:func:`with_data`), and the number of replacements; ``ev``
    itself when there is nothing to replace."""
    if not may_hold_non_finite(ev.raw):
        return ev, 0
    try:
        obj, replaced = loads_strict(ev.data)
    except ValueError:
        return ev, 0
    if not replaced:
        return ev, 0
    return with_data(ev, compact(obj)), replaced


def with_data(ev: SSEEvent, data: str) -> SSEEvent:
    """``ev`` with its data replaced by one line of JSON, every other line of the block kept."""
    lines: list[bytes] = []
    data_written = False
    for line in _LINE.split(ev.raw):
        if not line:
            continue
        if line.startswith(b"data") and (len(line) == 4 or line[4:5] == b":"):
            if not data_written:
                lines.append(b"data: " + data.encode("utf-8"))
                data_written = True
            continue
        lines.append(line)
    raw = b"\n".join(lines) + b"\n\n"
    return SSEEvent(event=ev.event, data=data, id=ev.id, retry=ev.retry, raw=raw)
