"""Synthetic stop answers, sent instead of calling upstream once a session's budget is used.

They are valid OpenAI chat completions (HTTP 200), so agents end their loop normally: empty
assistant content, ``finish_reason: "stop"``, zero usage, and the header
``x-gateway-stop-reason: max_steps``. As a stream: a role chunk, a finish chunk, a usage chunk with
``"choices": []`` only when the client asked for usage, then ``[DONE]``.
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
