"""The request bodies the gateway reads, validated at the boundary with pydantic.

Only the fields the gateway needs are typed; every other field (``tools``, ``logprobs``, vendor
extras) is kept (``extra="allow"``) and forwarded untouched. The forwarded body is the client's
JSON, never a re-serialisation of these models.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from gateway.errors import GatewayError


class ChatCompletionRequest(BaseModel):
    """``POST .../chat/completions`` body: ``model`` (a route key), ``messages`` (list of message
    objects), optional ``stream`` and ``stream_options``."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None


class CloseSessionRequest(BaseModel):
    """``POST /v1/sessions/{sid}/close`` body (optional): why and how the session ended."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = None
    completion_mode: str | None = None


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, at most ``limit`` bytes. Raises GatewayError(413,
    code ``request_too_large``) for a larger one, whether announced by ``Content-Length`` or
    found while reading a chunked body. The rest of an oversized body is read and discarded
    (not kept in memory) before the 413 is sent, so the client, still sending, gets the answer
    instead of a connection reset."""
    parts: list[bytes] = []
    size = 0
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
        if not over:
            parts.append(chunk)
    if over:
        raise GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes "
                                "(max_request_bytes)", code="request_too_large")
    return b"".join(parts)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object. Raises GatewayError(400) otherwise."""
    if not raw:
        raise GatewayError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise GatewayError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"request body must be a JSON object, not {type(body).__name__}")
    return body


def validate_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    """Validate the fields the gateway reads. Raises GatewayError(400) naming the bad field."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise GatewayError(400, f"{loc}: {first['msg']}", param=loc) from None
