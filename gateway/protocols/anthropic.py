"""Anthropic Messages (``POST .../v1/messages``) as a protocol adapter.

Upstream: ``<base_url>/v1/messages`` of an ``api: anthropic`` route (``base_url`` without
``/v1``), with ``x-api-key`` and ``anthropic-version`` (the client's, default ``2023-06-01``).
Errors in Anthropic's shape, a stream's as an ``event: error``. The ``messages`` column holds
``system`` as a system message, then ``messages``. Synthetic stop: an empty ``message`` with
``stop_reason: end_turn``. Details: docs/gateway-protocols.md.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from gateway.protocols.base import WireProtocol, compact
from gateway.settings import RouteSettings
from wire.assembly import Answer, MessagesStreamAssembler, StreamAssembler, read_messages
from wire.errors import anthropic_error
from wire.requests import MessagesRequest, WireRequest
from wire.sse import format_event

__all__ = ["DEFAULT_ANTHROPIC_VERSION", "AnthropicProtocol", "message_to_stream"]

DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProtocol(WireProtocol):
    """The Anthropic Messages adapter (see the module docstring)."""

    endpoint = "messages"
    upstream_path = "/v1/messages"
    api = "anthropic"
    request_model = MessagesRequest
    answer_name = "Anthropic message"
    stream_end = "message_stop"

    def upstream_headers(self, route: RouteSettings, client_headers: Mapping[str, str]) -> dict[str, str]:
        headers = {"anthropic-version": client_headers.get("anthropic-version") or DEFAULT_ANTHROPIC_VERSION}
        beta = client_headers.get("anthropic-beta")
        if beta:
            headers["anthropic-beta"] = beta
        if route.api_key:
            headers["x-api-key"] = route.api_key
        return headers

    def conversation(self, body: dict[str, Any]) -> Any:
        msgs: list[Any] = []
        if body.get("system") is not None:
            msgs.append({"role": "system", "content": body["system"]})
        if isinstance(body.get("messages"), list):
            msgs.extend(body["messages"])
        return msgs

    def assembler(self) -> MessagesStreamAssembler:
        return MessagesStreamAssembler()

    def is_answer(self, parsed: Any) -> bool:
        """A dict with ``type: "message"`` and a ``content`` list."""
        return (
            isinstance(parsed, dict)
            and parsed.get("type") == "message"
            and isinstance(parsed.get("content"), list)
        )

    def read(self, response: Any) -> Answer:
        return read_messages(response)

    def to_stream(self, answer: dict[str, Any], req: WireRequest) -> list[bytes]:
        return message_to_stream(answer)

    def stop_answer(self, model: str, req: WireRequest) -> dict[str, Any]:
        return {
            "id": f"msg_gw_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }

    def client_error(self, status: int, err: dict[str, Any]) -> dict[str, Any]:
        return anthropic_error(status, err)

    def stream_error(self, status: int, err: dict[str, Any], asm: StreamAssembler | None) -> bytes:
        return format_event(compact(self.client_error(status, err)), event="error")


def _event(obj: dict[str, Any]) -> bytes:
    return format_event(compact(obj), event=obj["type"])


def message_to_stream(message: dict[str, Any]) -> list[bytes]:
    """A finished ``message`` re-told as an Anthropic Messages stream (bytes, one per event):
    ``message_start`` (the message with no content, no stop reason and ``output_tokens: 0``);
    per content block ``content_block_start`` (text/thinking/tool_use blocks start empty), one
    delta with the whole block (``text_delta``; ``thinking_delta`` then ``signature_delta``;
    ``input_json_delta`` with the input as JSON text; other block types are sent whole in the
    start event) and ``content_block_stop``; then ``message_delta`` (``stop_reason``,
    ``stop_sequence``, the whole usage) and ``message_stop``."""
    raw_usage = message.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    out = [_event({"type": "message_start", "message": start})]
    content = message.get("content")
    for i, block in enumerate(content if isinstance(content, list) else []):
        kind = block.get("type") if isinstance(block, dict) else None
        deltas: list[dict[str, Any]] = []
        first = block
        if kind == "text":
            first = {**block, "text": ""}
            deltas.append({"type": "text_delta", "text": block.get("text") or ""})
        elif kind == "thinking":
            first = {**block, "thinking": "", "signature": ""}
            deltas.append({"type": "thinking_delta", "thinking": block.get("thinking") or ""})
            deltas.append({"type": "signature_delta", "signature": block.get("signature") or ""})
        elif kind == "tool_use":
            first = {**block, "input": {}}
            raw = block.get("input")
            deltas.append(
                {
                    "type": "input_json_delta",
                    "partial_json": raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False),
                }
            )
        out.append(_event({"type": "content_block_start", "index": i, "content_block": first}))
        out += [_event({"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        out.append(_event({"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    out.append(_event({"type": "message_delta", "delta": delta, "usage": dict(usage)}))
    out.append(_event({"type": "message_stop"}))
    return out
