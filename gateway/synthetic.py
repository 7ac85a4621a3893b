"""Answers the gateway writes itself.

* Synthetic stop answers, sent instead of calling upstream once a session's budget is used. They
  are valid OpenAI chat completions (HTTP 200), so agents end their loop normally: empty
  assistant content, ``finish_reason: "stop"``, zero usage, and the header
  ``x-gateway-stop-reason: max_steps``. As a stream: a role chunk, a finish chunk, a usage chunk
  with ``"choices": []`` only when the client asked for usage, then ``[DONE]``.
* :func:`completion_to_stream`: a finished ``chat.completion`` re-told as a chat stream, for a
  client that asked to stream from a route that cannot (``supports_stream: false``) or from an
  upstream that answered with plain JSON anyway.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

STOP_HEADER = {"x-gateway-stop-reason": "max_steps"}
_ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def _ids(model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-gw-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}


def chat_stop_completion(model: str) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` that stops the agent."""
    return {
        **_ids(model),
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": dict(_ZERO_USAGE),
    }


def chat_stop_stream(model: str, include_usage: bool) -> list[bytes]:
    """The SSE events (bytes, one per event) of a streamed synthetic stop."""
    base = {**_ids(model), "object": "chat.completion.chunk"}
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": dict(_ZERO_USAGE)})
    out = [b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks]
    out.append(b"data: [DONE]\n\n")
    return out


_MESSAGE_TO_DELTA_SKIP = frozenset({"tool_calls"})


def completion_to_stream(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE events (bytes, one per event) that stream a finished ``chat.completion`` object
    (OpenAI chat API) in the chat streaming format.

    Per choice, in ``index`` order: one chunk whose ``delta`` is the message (role, content,
    reasoning fields, refusal, vendor keys, and ``tool_calls`` each with its ``index`` added, so
    clients assemble them by index as usual), with ``finish_reason: null``; then one chunk with
    an empty delta, the choice's ``finish_reason`` and ``logprobs``. Then, only when the client
    asked for usage and the completion has one, a usage chunk with ``"choices": []`` (faults
    F1); then ``[DONE]``. ``id``/``created``/``model``/``system_fingerprint`` are copied."""
    base: dict[str, Any] = {"id": completion.get("id") or f"chatcmpl-gw-{uuid.uuid4().hex[:24]}",
                            "object": "chat.completion.chunk",
                            "created": completion.get("created") or int(time.time()),
                            "model": completion.get("model")}
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
            delta["tool_calls"] = [{"index": i, **c} if isinstance(c, dict) else c for i, c in enumerate(calls)]
        chunks.append({**base, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                            "finish_reason": None}]})
        chunks.append({**base, "choices": [{"index": index, "delta": {}, "logprobs": choice.get("logprobs"),
                                            "finish_reason": choice.get("finish_reason")}]})
    usage = completion.get("usage")
    if include_usage and isinstance(usage, dict):
        chunks.append({**base, "choices": [], "usage": usage})
    out = [b"data: " + json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
           for c in chunks]
    out.append(b"data: [DONE]\n\n")
    return out
