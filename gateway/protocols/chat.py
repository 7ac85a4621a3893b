"""OpenAI chat completions (``POST .../chat/completions``) as a protocol adapter.

To meter a stream, the gateway adds ``stream_options.include_usage`` to a streaming request
whose client did not ask for usage, and hides the usage-only chunk from that client. Synthetic
stop: an empty assistant message with ``finish_reason: stop`` and zero usage (streamed as a
role chunk, a finish chunk, a usage chunk only if asked, ``[DONE]``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.protocols.base import WireProtocol, compact
from gateway.settings import RouteSettings
from wire.assembly import Answer, ChatStreamAssembler, read_chat
from wire.requests import ChatCompletionRequest, WireRequest

__all__ = ["ChatProtocol", "completion_to_stream"]

_ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
_MESSAGE_TO_DELTA_SKIP = frozenset({"tool_calls"})


def _client_usage(req: WireRequest) -> bool:
    opts = getattr(req, "stream_options", None)
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


class ChatProtocol(WireProtocol):
    """The chat completions adapter (see the module docstring)."""

    endpoint = "chat.completions"
    upstream_path = "/chat/completions"
    api = "openai"
    request_model = ChatCompletionRequest
    answer_name = "chat completion"
    stream_end = "[DONE]"

    def upstream_body(
        self, req: WireRequest, body: dict[str, Any], route: RouteSettings
    ) -> tuple[dict[str, Any], bool]:
        """The default, plus ``stream_options.include_usage: true`` for a stream whose client
        did not ask for usage (the second value is then True)."""
        out, _ = super().upstream_body(req, body, route)
        if req.stream and route.supports_stream and not _client_usage(req):
            opts = getattr(req, "stream_options", None) or {}
            return {**out, "stream_options": {**opts, "include_usage": True}}, True
        return out, False

    def assembler(self) -> ChatStreamAssembler:
        return ChatStreamAssembler()

    def is_answer(self, parsed: Any) -> bool:
        """A dict with a ``choices`` list and no ``error``."""
        return (
            isinstance(parsed, dict)
            and isinstance(parsed.get("choices"), list)
            and parsed.get("error") is None
        )

    def read(self, response: Any) -> Answer:
        return read_chat(response)

    def hide_event(self, obj: Any) -> bool:
        """The usage-only chunk the gateway asked for."""
        return isinstance(obj, dict) and obj.get("choices") == [] and obj.get("usage") is not None

    def to_stream(self, answer: dict[str, Any], req: WireRequest) -> list[bytes]:
        return completion_to_stream(answer, _client_usage(req))

    def stop_answer(self, model: str, req: WireRequest) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-gw-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": dict(_ZERO_USAGE),
        }


def completion_to_stream(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE events (bytes, one per event) that stream a finished ``chat.completion`` object
    (OpenAI chat API) in the chat streaming format.

    Per choice, in ``index`` order: one chunk whose ``delta`` is the message (role, content,
    reasoning fields, refusal, vendor keys, and ``tool_calls`` each with its ``index`` added, so
    clients assemble them by index as usual), with ``finish_reason: null``; then one chunk with
    an empty delta, the choice's ``finish_reason`` and ``logprobs``. Then, only when the client
    asked for usage and the completion has one, a usage chunk with ``"choices": []``;
    then ``[DONE]``. ``id``/``created``/``model``/``system_fingerprint`` are copied."""
    base: dict[str, Any] = {
        "id": completion.get("id") or f"chatcmpl-gw-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk",
        "created": completion.get("created") or int(time.time()),
        "model": completion.get("model"),
    }
    if completion.get("system_fingerprint") is not None:
        base["system_fingerprint"] = completion["system_fingerprint"]
    chunks: list[dict[str, Any]] = []
    choices = [c for c in completion.get("choices") or [] if isinstance(c, dict)]
    for position, choice in enumerate(choices):
        index = choice.get("index", position)
        raw_message = choice.get("message")
        message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
        delta: dict[str, Any] = {k: v for k, v in message.items() if k not in _MESSAGE_TO_DELTA_SKIP}
        delta.setdefault("role", "assistant")
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            delta["tool_calls"] = [
                {"index": i, **c} if isinstance(c, dict) else c for i, c in enumerate(calls)
            ]
        chunks.append(
            {**base, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}
        )
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": index,
                        "delta": {},
                        "logprobs": choice.get("logprobs"),
                        "finish_reason": choice.get("finish_reason"),
                    }
                ],
            }
        )
    usage = completion.get("usage")
    if include_usage and isinstance(usage, dict):
        chunks.append({**base, "choices": [], "usage": usage})
    out = [b"data: " + compact(c).encode() + b"\n\n" for c in chunks]
    out.append(b"data: [DONE]\n\n")
    return out
