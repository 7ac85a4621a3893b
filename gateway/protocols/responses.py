"""OpenAI Responses (``POST .../responses``) as a protocol adapter.

Streams are relayed event by event and assembled from the terminal event's ``response``; a
stream the gateway ends with an error gets a Responses ``error`` event. The ``messages`` column
holds ``instructions`` as a system message, then ``input`` (a string as one user message).
Synthetic stop: a completed ``response`` with empty ``output`` and zero usage.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.protocols.base import WireProtocol, compact, inner_error
from wire.assembly import Answer, ResponsesStreamAssembler, StreamAssembler, read_responses
from wire.requests import ResponsesRequest, WireRequest
from wire.sse import format_event
from wire.status import StepStatus

__all__ = ["ResponsesProtocol", "response_to_stream"]

_TERMINAL_BY_STATUS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


class ResponsesProtocol(WireProtocol):
    """The Responses adapter (see the module docstring)."""

    endpoint = "responses"
    upstream_path = "/responses"
    api = "openai"
    request_model = ResponsesRequest
    answer_name = "Responses `response` object"
    stream_end = "response.completed"

    def conversation(self, body: dict[str, Any]) -> Any:
        msgs: list[Any] = []
        if isinstance(body.get("instructions"), str):
            msgs.append({"role": "system", "content": body["instructions"]})
        inp = body.get("input")
        if isinstance(inp, str):
            msgs.append({"role": "user", "content": inp})
        elif isinstance(inp, list):
            msgs.extend(inp)
        return msgs

    def assembler(self) -> ResponsesStreamAssembler:
        return ResponsesStreamAssembler()

    def is_answer(self, parsed: Any) -> bool:
        """A dict with an ``output`` list (a ``status: "failed"`` response included)."""
        return isinstance(parsed, dict) and isinstance(parsed.get("output"), list)

    def read(self, response: Any) -> Answer:
        return read_responses(response)

    def answer_status(self, answer: dict[str, Any]) -> StepStatus:
        return StepStatus.ERROR if answer.get("status") == "failed" else StepStatus.OK

    def to_stream(self, answer: dict[str, Any], req: WireRequest) -> list[bytes]:
        return response_to_stream(answer)

    def stop_answer(self, model: str, req: WireRequest) -> dict[str, Any]:
        return {
            "id": f"resp_gw_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "model": model,
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "temperature": None,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
            "truncation": "disabled",
            "metadata": {},
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        }

    def stream_error(self, status: int, err: dict[str, Any], asm: StreamAssembler | None) -> bytes:
        inner = inner_error(err)
        last = getattr(asm, "last_sequence_number", None)
        event = {
            "type": "error",
            "code": inner.get("code"),
            "message": inner.get("message"),
            "param": inner.get("param"),
            "sequence_number": last + 1 if isinstance(last, int) else 0,
        }
        return format_event(compact(event), event="error")


def response_to_stream(response: dict[str, Any]) -> list[bytes]:
    """A finished ``response`` object re-told as a Responses stream (bytes, one per event):
    ``response.created`` and ``response.in_progress`` (the response with ``status:
    "in_progress"``, no output, no usage), then per output item ``response.output_item.added``
    and ``response.output_item.done`` (the whole item), then the terminal event of its status
    (``response.completed``, ``.incomplete`` or ``.failed``) with the response itself.
    ``sequence_number`` counts from 0."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    output = response.get("output")
    for i, item in enumerate(output if isinstance(output, list) else []):
        events.append({"type": "response.output_item.added", "output_index": i, "item": item})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    terminal = _TERMINAL_BY_STATUS.get(str(response.get("status")), "response.completed")
    events.append({"type": terminal, "response": response})
    return [
        format_event(compact({**ev, "sequence_number": n}), event=ev["type"]) for n, ev in enumerate(events)
    ]
