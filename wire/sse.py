"""Incremental Server-Sent Events parser and writers (WHATWG HTML, "Server-sent events").

:class:`SSEParser` follows "Parsing/Interpreting an event stream": UTF-8 with one leading BOM
stripped, CRLF/LF/CR line ends (a CR and LF split across reads are one), ``:`` comments ignored,
a blank line dispatches unless the data is empty, an unterminated last event is discarded.
Framing works on bytes with no line-length limit, in O(total bytes). Details:
docs/gateway-protocols.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser", "format_event", "sse_comment"]

_BOM = b"\xef\xbb\xbf"
_LINE_SPLIT = re.compile(r"\r\n|\r|\n")


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event (WHATWG HTML, "Server-sent events", dispatch step).

    * ``event``: the ``event:`` field value, or None when the block had none (the spec then
      uses the type ``"message"``).
    * ``data``: the ``data:`` field values joined with ``"\\n"`` (never has a trailing newline).
    * ``id``: the last event ID buffer at dispatch time (as the spec's ``lastEventId``: it
      persists from earlier blocks until another ``id:`` line changes it), or None if no
      ``id:`` line was ever seen.
    * ``retry``: the reconnection time in ms given by a valid ``retry:`` line in this block, or
      None.
    * ``raw``: the exact bytes of this event block, from the first byte after the previous block
      (comment lines of the block included, a stripped BOM excluded) up to and including the
      terminating blank line, so the block can be forwarded verbatim. One exception: when the
      blank line is a CR that ends a read and the next read starts with its LF, that LF is
      consumed as part of the line end and appears in no ``raw``.
    """

    event: str | None
    data: str
    id: str | None
    retry: int | None
    raw: bytes


class SSEParser:
    """Incremental byte-level parser for a ``text/event-stream`` body.

    Follows the WHATWG HTML standard, section "Server-sent events" (event stream parsing and
    interpretation; see the module docstring for the rules). Feed the body bytes as they arrive,
    in pieces of any size; the resulting event list does not depend on where the pieces are cut.

    Usage::

        parser = SSEParser()
        for piece in body_pieces:
            for ev in parser.feed(piece):
                ...
        parser.close()   # always [] (an unterminated last event is discarded, per the spec)

    Attributes after parsing: ``last_event_id`` (str | None) and ``retry`` (the last valid
    reconnection time in ms, or None); ``pending_bytes`` is the count of buffered bytes of the
    current, not yet terminated block (non-zero at EOF means the stream ended mid-event or
    mid-line; blocks ended by a blank line, dispatched or not, are dropped from the buffer).
    """

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
        """Add the next bytes of the stream; return the events completed by them, in order.

        Raises RuntimeError after ``close()``.
        """
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
        """Signal end of stream. Returns [] : per the spec an event that was not terminated by a
        blank line is discarded, never dispatched. Clears the buffer."""
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
    """Encode ``text`` as SSE comment line(s) (WHATWG "Server-sent events": lines starting with
    ``:``), e.g. ``sse_comment("ping") == b": ping\\n"``.

    Deliberately NOT followed by a blank line: openai-python's decoder dispatches an empty-data
    event on a lone blank line once an ``id:`` was seen, and then fails to parse it.
    A comment line between two complete events is ignored by every conforming parser. Multi-line
    text becomes one comment line per line.
    """
    lines = _LINE_SPLIT.split(text) if text else [""]
    return "".join(f": {line}\n" if line else ":\n" for line in lines).encode("utf-8")


def format_event(data: str, event: str | None = None) -> bytes:
    """Encode one SSE event (WHATWG "Server-sent events" wire format): an optional
    ``event: NAME`` line, one ``data: LINE`` line per line of ``data`` (split on CRLF, CR or LF,
    so a conforming parser gets ``data`` back joined with ``"\\n"``), then a blank line.

    Raises ValueError when ``event`` contains a line break.
    """
    parts: list[str] = []
    if event is not None:
        if "\n" in event or "\r" in event:
            raise ValueError("SSE event name must not contain a line break")
        parts.append(f"event: {event}\n")
    for line in _LINE_SPLIT.split(data):
        parts.append(f"data: {line}\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8")
