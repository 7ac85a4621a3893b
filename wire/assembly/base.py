"""What the stream assemblers share: the :class:`Answer` read from a finished answer object and the
:class:`StreamAssembler` interface the gateway's forwarding core drives. Pure data code."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from wire.sse import SSEEvent
from wire.status import StepStatus

__all__ = ["Answer", "StreamAssembler", "as_int", "parse_event_json", "text_of"]


@dataclass(frozen=True, slots=True)
class Answer:
    """The model-facing facts of one answer object, whatever its protocol; tool calls in the OpenAI chat
    shape, ``finish_reason`` in the protocol's words, token counts None when not reported
    (docs/gateway-protocols.md, "Reading an answer")."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class StreamAssembler(Protocol):
    """An assembler of one protocol's SSE stream into its non-streaming answer: :meth:`feed_event` each
    event (its parsed JSON, or None), then :meth:`status`, :meth:`result` and :meth:`notes` (extra
    ``meta_json``). ``finished`` turns true at the event that ends the stream properly, which the
    core holds back until the step is recorded."""

    chunk_count: int
    error: dict[str, Any] | None

    @property
    def finished(self) -> bool: ...

    def feed_event(self, ev: SSEEvent) -> Any: ...

    def status(self) -> StepStatus: ...

    def result(self) -> dict[str, Any]: ...

    def notes(self) -> dict[str, Any]: ...


def parse_event_json(data: str) -> Any:
    """``json.loads(data)``, or None when ``data`` is not JSON."""
    try:
        return json.loads(data)
    except ValueError:
        return None


def as_int(mapping: Any, key: str) -> int | None:
    """``mapping[key]`` when ``mapping`` is a dict and the value an int (not a bool), else None."""
    v = mapping.get(key) if isinstance(mapping, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def text_of(value: Any) -> str | None:
    """A streamed text field as str (None stays None; non-strings are JSON-encoded)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
