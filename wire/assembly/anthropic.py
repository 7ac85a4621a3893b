"""Assemble an Anthropic Messages stream into the ``message`` object as the anthropic SDK's own
accumulator does, and read a message (docs/gateway-protocols.md, "Anthropic Messages stream
assembly")."""

from __future__ import annotations

import json
from typing import Any

from wire.assembly.base import Answer, as_int, parse_event_json, text_of
from wire.sse import SSEEvent
from wire.status import StepStatus

__all__ = ["MessagesStreamAssembler", "read_messages"]


class MessagesStreamAssembler:
    """Accumulates Anthropic Messages stream events into one ``message``; :meth:`status` is ``ok``,
    ``error`` or ``truncated``."""

    def __init__(self) -> None:
        self.chunk_count = 0
        self.invalid_count = 0
        self.error: dict[str, Any] | None = None
        self.saw_stop = False
        self._message: dict[str, Any] | None = None
        self._usage: dict[str, Any] = {}
        self._delta: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._pieces: dict[tuple[int, str], list[str]] = {}  # (block index, field) -> appended text
        self._signature: dict[int, str] = {}
        self._citations: dict[int, list[Any]] = {}

    @property
    def finished(self) -> bool:
        """True once ``message_stop`` arrived."""
        return self.saw_stop

    def feed_event(self, ev: SSEEvent) -> Any:
        """Feed one SSE event; returns its parsed JSON (None when it is not JSON). The type is the
        payload's ``type``, else the ``event:`` field."""
        self.chunk_count += 1
        obj = parse_event_json(ev.data)
        if not isinstance(obj, dict):
            self.invalid_count += 1
            return obj
        kind = obj.get("type") if isinstance(obj.get("type"), str) else ev.event
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            self._message = dict(obj["message"])
            usage = self._message.get("usage")
            self._usage = dict(usage) if isinstance(usage, dict) else {}
        elif kind == "content_block_start":
            index, block = as_int(obj, "index"), obj.get("content_block")
            if index is not None and isinstance(block, dict):
                self._blocks[index] = dict(block)
        elif kind == "content_block_delta":
            self._feed_delta(obj)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                self._delta.update(delta)
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.saw_stop = True
        elif kind == "error":
            err = obj.get("error")
            self.error = dict(err) if isinstance(err, dict) else {"message": str(err)}
        return obj

    def _feed_delta(self, obj: dict[str, Any]) -> None:
        index, delta = as_int(obj, "index"), obj.get("delta")
        if index is None or not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            self._append(index, "text", delta.get("text"))
        elif kind == "thinking_delta":
            self._append(index, "thinking", delta.get("thinking"))
        elif kind == "input_json_delta":
            self._append(index, "input", delta.get("partial_json"))
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            self._signature[index] = delta["signature"]
        elif kind == "citations_delta" and delta.get("citation") is not None:
            self._citations.setdefault(index, []).append(delta["citation"])

    def _append(self, index: int, key: str, value: Any) -> None:
        piece = text_of(value)
        if piece:
            self._pieces.setdefault((index, key), []).append(piece)

    def status(self) -> StepStatus:
        """See the module docstring."""
        if self.error is not None:
            return StepStatus.ERROR
        return StepStatus.OK if self.saw_stop else StepStatus.TRUNCATED

    def notes(self) -> dict[str, Any]:
        """Extra ``meta_json`` keys: ``invalid_events`` when some event was not JSON."""
        return {"invalid_events": self.invalid_count} if self.invalid_count else {}

    def _block(self, index: int) -> dict[str, Any]:
        block = dict(self._blocks[index])
        for key in ("text", "thinking"):
            pieces = self._pieces.get((index, key))
            if pieces:
                block[key] = (block.get(key) or "") + "".join(pieces)
        if index in self._signature:
            block["signature"] = self._signature[index]
        if index in self._citations:
            block["citations"] = list(block.get("citations") or []) + self._citations[index]
        raw = self._pieces.get((index, "input"))
        if raw is not None:  # input_json_delta pieces replace the start's (empty) input
            text = "".join(raw)
            try:
                block["input"] = json.loads(text)
            except ValueError:
                block["input"] = text
        return block

    def result(self) -> dict[str, Any]:
        """The ``message`` object (``message_start.message`` with the blocks, the
        ``message_delta`` keys and the merged usage); may be called at any time."""
        message = dict(self._message or {"type": "message", "role": "assistant"})
        message["content"] = [self._block(i) for i in sorted(self._blocks)]
        message.update(self._delta)
        if self._usage or "usage" in message:
            message["usage"] = dict(self._usage)
        return message


def read_messages(response: Any) -> Answer:
    """The :class:`Answer` of an Anthropic ``message`` object."""
    if not isinstance(response, dict):
        return Answer()
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    content = response.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            args = block.get("input")
            arguments = (
                args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, separators=(",", ":"))
            )
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    stop = response.get("stop_reason")
    usage = response.get("usage")
    prompt, completion = as_int(usage, "input_tokens"), as_int(usage, "output_tokens")
    total = prompt + completion if prompt is not None and completion is not None else None
    return Answer(
        content="".join(texts) if texts else None,
        reasoning="".join(thinking) if thinking else None,
        tool_calls=calls,
        finish_reason=stop if isinstance(stop, str) else None,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
    )
