"""Incremental Server-Sent Events parser and writers (WHATWG HTML, "Server-sent events"; the rules:
docs/gateway-protocols.md, "SSE parsing")."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser", "format_event", "sse_comment"]

_BOM = b"\xef\xbb\xbf"
_LINE_SPLIT = re.compile(r"\r\n|\r|\n")


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event; ``raw`` is the block's exact bytes, to forward verbatim."""

    event: str | None
    data: str
    id: str | None
    retry: int | None
    raw: bytes


class SSEParser:
    """Incremental byte-level parser of a ``text/event-stream`` body: :meth:`feed` the bytes as they
    arrive, in pieces of any size (the events do not depend on where they are cut), then
    :meth:`close` (an unterminated last event is discarded). ``last_event_id``, ``retry`` and
    ``pending_bytes`` tell the state after parsing."""

    __slots__ = (
        "_buf",
        "_scan",
        "_line_start",
        "_skip_lf",
        "_bom_done",
        "_closed",
        "_data",
        "_event",
        "_block_retry",
        "last_event_id",
        "retry",
    )

    def __init__(self) -> None:
        # _buf holds the bytes of the current (undispatched) block from its first byte on.
        self._buf = bytearray()
        self._scan = 0  # next index of _buf not yet searched for a line terminator
        self._line_start = 0  # index in _buf where the current (incomplete) line starts
        self._skip_lf = False  # the previous read ended with a CR: a leading LF belongs to it
        self._bom_done = False
        self._closed = False
        self._data: list[str] = []
        self._event: str | None = None
        self._block_retry: int | None = None
        self.last_event_id: str | None = None
        self.retry: int | None = None

    @property
    def pending_bytes(self) -> int:
        """Number of buffered bytes not yet part of a dispatched event."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Add the next bytes of the stream; the events they complete, in order. RuntimeError after close."""
        if self._closed:
            raise RuntimeError("SSEParser.feed() after close()")
        if not data:
            return []
        buf = self._buf
        buf += data
        if not self._bom_done:
            if len(buf) < len(_BOM) and _BOM.startswith(bytes(buf)):
                return []  # could still be a BOM split across reads
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            self._bom_done = True
        if self._skip_lf and self._scan < len(buf):
            self._skip_lf = False
            if buf[self._scan] == 0x0A:
                if self._scan == 0:
                    # The LF completes a CRLF whose CR ended the previous block: drop it.
                    del buf[0]
                else:
                    self._scan += 1
                    self._line_start = self._scan
        return self._parse_lines()

    def close(self) -> list[SSEEvent]:
        """End of stream: clears the buffer; returns [] (an unterminated event is never dispatched)."""
        self._closed = True
        self._buf.clear()
        self._scan = self._line_start = 0
        self._data = []
        self._event = None
        self._block_retry = None
        return []

    def _parse_lines(self) -> list[SSEEvent]:
        buf = self._buf
        events: list[SSEEvent] = []
        n = len(buf)
        pos = self._scan
        lf = -2  # index of the next LF at or after pos; -1: none before n; -2: not searched yet
        while pos < n:
            if lf == -2 or (lf >= 0 and lf < pos):
                lf = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, lf if lf >= 0 else n)
            if cr >= 0:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
                else:
                    nxt = cr + 1
                    self._skip_lf = True  # the LF of a CRLF may start the next read
            elif lf >= 0:
                end = lf
                nxt = lf + 1
            else:
                pos = n
                break
            start = self._line_start
            pos = self._line_start = nxt
            if end == start:
                ev = self._dispatch(nxt)
                # The block ended: drop its bytes so the buffer only holds the next block.
                del buf[:nxt]
                n = len(buf)
                lf = lf - nxt if lf >= nxt else -2  # shift the cached LF index, or search again
                pos = self._line_start = 0
                if ev is not None:
                    events.append(ev)
            else:
                self._process_line(buf, start, end)
        self._scan = pos
        return events

    def _process_line(self, buf: bytearray, start: int, end: int) -> None:
        if buf[start] == 0x3A:  # ':' comment
            return
        colon = buf.find(b":", start, end)
        if colon < 0:
            field = bytes(buf[start:end]).decode("utf-8", "replace")
            value = ""
        else:
            field = bytes(buf[start:colon]).decode("utf-8", "replace")
            vstart = colon + 1
            if vstart < end and buf[vstart] == 0x20:
                vstart += 1
            value = bytes(buf[vstart:end]).decode("utf-8", "replace")
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\x00" not in value:
                self.last_event_id = value
        elif field == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry = self._block_retry = int(value)
        # any other field name is ignored, per the spec

    def _dispatch(self, block_end: int) -> SSEEvent | None:
        data, event, retry = self._data, self._event, self._block_retry
        self._data = []
        self._event = None
        self._block_retry = None
        if not data:
            return None
        return SSEEvent(
            event=event or None,
            data="\n".join(data),
            id=self.last_event_id,
            retry=retry,
            raw=bytes(self._buf[:block_end]),
        )


def sse_comment(text: str = "") -> bytes:
    """``text`` as SSE comment line(s), ``sse_comment("ping") == b": ping\\n"``, deliberately with no
    blank line after (openai-python fails on the empty event a lone blank line dispatches)."""
    lines = _LINE_SPLIT.split(text) if text else [""]
    return "".join(f": {line}\n" if line else ":\n" for line in lines).encode("utf-8")


def format_event(data: str, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line, one ``data:`` line per line of ``data``, a blank
    line. ValueError for an event name with a line break."""
    parts: list[str] = []
    if event is not None:
        if "\n" in event or "\r" in event:
            raise ValueError("SSE event name must not contain a line break")
        parts.append(f"event: {event}\n")
    for line in _LINE_SPLIT.split(data):
        parts.append(f"data: {line}\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8")
