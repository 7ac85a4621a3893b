"""What the three stream assemblers share: the :class:`Answer` read from a finished answer object
(for the promoted step columns and the evaluator's trajectory) and the :class:`StreamAssembler`
interface the forwarding core drives (:mod:`gateway.forward`).

Pure data code: no HTTP, no FastAPI, so the launcher's trajectory builder may import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from wire.sse import SSEEvent
from wire.status import StepStatus

__all__ = ["Answer", "StreamAssembler", "as_int", "parse_event_json", "text_of"]


@dataclass(frozen=True, slots=True)
class Answer:
    """The model-facing facts of one answer object, protocol-independent.

    * ``content``: the assistant text (None when the answer holds no text part at all);
    * ``reasoning``: reasoning/thinking text, or None;
    * ``tool_calls``: tool calls in the OpenAI chat shape
      ``[{"id", "type": "function", "function": {"name", "arguments": str}}]``;
    * ``finish_reason``: why the answer ended, in the protocol's own words (chat
      ``finish_reason``, Responses ``status`` or ``incomplete_details.reason``, Anthropic
      ``stop_reason``);
    * token counts (None when the answer did not report them; never a made-up 0).
    """

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class StreamAssembler(Protocol):
    """An assembler of one protocol's SSE stream into that protocol's non-streaming answer.

    The forwarding core feeds every dispatched SSE event to :meth:`feed_event` (which returns
    the event's parsed JSON, or None) and, at the end, reads :meth:`status` and :meth:`result`.
    ``finished`` turns true at the event that ends the stream properly (chat ``[DONE]``,
    Responses ``response.completed``/``.failed``/``.incomplete``, Anthropic ``message_stop``):
    the core holds that event back until the step is recorded (strict telemetry).
    ``chunk_count`` counts the events fed (``[DONE]`` excluded), ``error`` is the in-stream error
    object when one arrived; :meth:`notes` gives extra facts for the step's ``meta_json``
    (``invalid_events``: events whose data was not JSON; read after :meth:`result`)."""

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
