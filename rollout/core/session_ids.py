"""A compact list of session ids: a job of 100k sessions keeps its run order in ~1.6 MB."""

from __future__ import annotations

import re

_HEX32 = re.compile(r"[0-9a-f]{32}")


class SessionIds:
    """Session ids in order, about 16 bytes each when they are uuid4 hex (as ``session_rows``
    makes them), else as strings."""

    def __init__(self) -> None:
        self._packed = bytearray()
        self._other: list[str] | None = None

    def append(self, sid: str) -> None:
        """Add ``sid`` at the end."""
        if self._other is None and _HEX32.fullmatch(sid):
            self._packed += bytes.fromhex(sid)
            return
        if self._other is None:
            self._other = [bytes(self._packed[i : i + 16]).hex() for i in range(0, len(self._packed), 16)]
            self._packed = bytearray()
        self._other.append(sid)

    def __len__(self) -> int:
        return len(self._other) if self._other is not None else len(self._packed) // 16

    def __getitem__(self, span: slice) -> list[str]:
        if self._other is not None:
            return self._other[span]
        start, stop, _ = span.indices(len(self))
        return [self._packed[16 * i : 16 * i + 16].hex() for i in range(start, stop)]
