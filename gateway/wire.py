"""The request bodies the gateway reads, validated at the boundary with pydantic.

The standard fields whose wrong type would only come back from the upstream as an opaque 500 are
typed (see :class:`ChatCompletionRequest`, :class:`ResponsesRequest` and
:class:`MessagesRequest`); every other field (``logprobs``, ``response_format``, vLLM/SGLang
extras such as ``top_k`` or ``chat_template_kwargs``, Anthropic beta fields) is kept
(``extra="allow"``) and forwarded untouched. The forwarded body is the client's JSON bytes, never a re-serialisation of
these models.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from starlette.requests import Request

from gateway.errors import GatewayError

# JSON numbers only (an int is a number; a bool or a numeric string is not).
_Temperature = Annotated[float, Field(strict=True, ge=0, le=2)]
_TopP = Annotated[float, Field(strict=True, ge=0, le=1)]
_Unit = Annotated[float, Field(strict=True, ge=0, le=1)]
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class WireRequest(BaseModel):
    """What every model-call body has: ``model`` (a route key) and ``stream`` (a boolean, absent
    or null meaning false). Every other key is kept as sent (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")

    # Field order is the order errors are reported in (the first one names ``param``): the
    # fields that decide how the gateway routes and answers come first.
    model: StrictStr
    stream: StrictBool | None = False


class ChatMessage(BaseModel):
    """One entry of ``messages``: an object with a string ``role``. Any role is accepted (vendors
    add their own, e.g. ``developer``, ``ipython``) and every other key is kept as sent."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr


class ChatCompletionRequest(WireRequest):
    """``POST .../chat/completions`` body (OpenAI API reference, "Create chat completion").

    Checked: ``model`` a string (a route key); ``messages`` a non-empty list of objects, each with
    a string ``role``; ``temperature`` a number in [0, 2]; ``top_p`` a number in [0, 1];
    ``max_tokens``, ``max_completion_tokens`` and ``n`` integers >= 1; ``stream`` a boolean;
    ``stream_options`` an object; ``tools`` a list of objects; ``stop`` a string or a list of
    strings. Each optional field may also be null or absent. Everything else passes unchecked."""

    stream_options: dict[str, Any] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    max_tokens: _PositiveInt | None = None
    max_completion_tokens: _PositiveInt | None = None
    n: _PositiveInt | None = None
    tools: list[dict[str, Any]] | None = None
    stop: StrictStr | list[StrictStr] | None = None


class ResponsesRequest(WireRequest):
    """``POST .../responses`` body (OpenAI API reference, "Create a model response").

    Checked: ``model`` a string (a route key); ``stream`` a boolean; ``input`` a string or a list
    of objects (input items); ``instructions`` a string; ``temperature`` a number in [0, 2];
    ``top_p`` a number in [0, 1]; ``max_output_tokens`` an integer >= 1; ``tools`` a list of
    objects; ``stream_options`` an object. Each may be null or absent (``input`` too: a request
    may continue ``previous_response_id`` or use a stored prompt). Everything else passes
    unchecked."""

    stream_options: dict[str, Any] | None = None
    input: StrictStr | list[dict[str, Any]] | None = None
    instructions: StrictStr | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    max_output_tokens: _PositiveInt | None = None
    tools: list[dict[str, Any]] | None = None


class AnthropicMessage(BaseModel):
    """One entry of an Anthropic ``messages`` list: a string ``role`` and a ``content`` that is
    a string or a list of content-block objects; other keys are kept as sent."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]]


class MessagesRequest(WireRequest):
    """``POST .../v1/messages`` body (Anthropic API reference, "Messages").

    Checked: ``model`` a string (a route key); ``stream`` a boolean; ``max_tokens`` an integer
    >= 1 (required, as Anthropic requires it); ``messages`` a non-empty list of objects with a
    string ``role`` and a string-or-list ``content``; ``system`` a string or a list of objects;
    ``temperature`` and ``top_p`` numbers in [0, 1]; ``top_k`` an integer >= 0;
    ``stop_sequences`` a list of strings; ``tools`` a list of objects; ``tool_choice``,
    ``thinking`` and ``metadata`` objects. Everything else passes unchecked."""

    max_tokens: _PositiveInt
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: StrictStr | list[dict[str, Any]] | None = None
    temperature: _Unit | None = None
    top_p: _TopP | None = None
    top_k: _NonNegativeInt | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


# What each checked field must be, for the 400 message.
_EXPECTED = {
    "model": "a string (a route key)",
    "messages": "a non-empty list of message objects, each with a string `role`",
    "stream": "a boolean",
    "stream_options": "an object",
    "temperature": "a number between 0 and 2",
    "top_p": "a number between 0 and 1",
    "max_tokens": "an integer >= 1",
    "max_completion_tokens": "an integer >= 1",
    "n": "an integer >= 1",
    "tools": "a list of objects",
    "stop": "a string or a list of strings",
    "input": "a string or a list of input item objects",
    "instructions": "a string",
    "max_output_tokens": "an integer >= 1",
}
_EXPECTED_ANTHROPIC = {
    **_EXPECTED,
    "messages": "a non-empty list of message objects, each with a string `role` and a string or list `content`",
    "temperature": "a number between 0 and 1",
    "top_k": "an integer >= 0",
    "system": "a string or a list of text block objects",
    "stop_sequences": "a list of strings",
    "tool_choice": "an object",
    "thinking": "an object",
    "metadata": "an object",
}
_EXPECTED_BY_MODEL: dict[type[WireRequest], dict[str, str]] = {MessagesRequest: _EXPECTED_ANTHROPIC}


class CloseSessionRequest(BaseModel):
    """``POST /v1/sessions/{sid}/close`` body (optional): why and how the session ended."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = None
    completion_mode: str | None = None


CONTROL_BODY_BYTES = 64 * 1024
"""The largest body of a control call (a session close, the admin endpoints): a few fields."""
CONTROL_LIMIT_NAME = "control body limit, fixed: a close or admin body holds a few fields"


async def read_body(request: Request, limit: int, limit_name: str = "max_request_bytes") -> bytes:
    """The whole request body, at most ``limit`` bytes (``limit_name``, the limit's name in the
    error message: the setting, or :data:`CONTROL_LIMIT_NAME`). Raises GatewayError(413,
    code ``request_too_large``) for a larger one, whether announced by ``Content-Length`` or
    found while reading a chunked body. The rest of an oversized body is read and discarded
    (not kept in memory) before the 413 is sent, so the client, still sending, gets the answer
    instead of a connection reset; except when ``Content-Length`` announces more than twice the
    limit: then the 413 is sent at once (a client announcing a body it never sends would
    otherwise hold the connection)."""
    parts: list[bytes] = []
    size = 0
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    if over and int(declared) > 2 * limit:
        raise GatewayError(413, f"request body ({declared} bytes announced) is larger than the gateway's limit of "
                                f"{limit} bytes ({limit_name})", code="request_too_large")
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
        if not over:
            parts.append(chunk)
    if over:
        raise GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes "
                                f"({limit_name})", code="request_too_large")
    return b"".join(parts)


async def read_control_body(request: Request) -> bytes:
    """The body of a control call, at most :data:`CONTROL_BODY_BYTES` (413 naming that limit)."""
    return await read_body(request, CONTROL_BODY_BYTES, CONTROL_LIMIT_NAME)


MAX_SESSION_ID_CHARS = 128  # the width of the session_id columns (store.models)


def check_session_id(session_id: str) -> str:
    """``session_id`` when it can name a session: 1 to :data:`MAX_SESSION_ID_CHARS` characters,
    none of them a control character (Unicode category Cc: NUL, CR, LF, ... cannot go into the
    ``X-Session-Id`` header or a per-session upstream URL). Raises GatewayError(400, code
    ``invalid_session_id``) otherwise, before any budget is used."""
    if not session_id.strip():
        raise GatewayError(400, f"session id {session_id!r} is empty or only whitespace", code="invalid_session_id")
    if len(session_id) > MAX_SESSION_ID_CHARS:
        raise GatewayError(400, f"session id must be 1 to {MAX_SESSION_ID_CHARS} characters, got "
                                f"{len(session_id)}", code="invalid_session_id")
    if not session_id.isprintable() and any(unicodedata.category(c) == "Cc" for c in session_id):
        raise GatewayError(400, f"session id {session_id!r} contains a control character",
                           code="invalid_session_id")
    return session_id


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object. Raises GatewayError(400) otherwise
    (empty, not JSON, not an object, or nested deeper than Python's recursion limit)."""
    if not raw:
        raise GatewayError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise GatewayError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise GatewayError(400, "request body is nested too deeply to be decoded") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"request body must be a JSON object, not {type(body).__name__}")
    return body


R = TypeVar("R", bound=WireRequest)


def validate_request(model: type[R], body: dict[str, Any]) -> R:
    """Validate a model-call body against ``model`` (:class:`ChatCompletionRequest`,
    :class:`ResponsesRequest` or :class:`MessagesRequest`). Raises GatewayError(400) whose
    ``param`` is the top-level field at fault (e.g. ``messages`` for ``messages[2].role``) and
    whose message names the exact place, what was expected and what pydantic found."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        first = errors[0]
        loc = first["loc"]
        field = str(loc[0]) if loc else "body"
        where = field + "".join(f"[{x}]" for x in loc[1:] if isinstance(x, int))
        if field == "messages" and len(loc) > 2 and loc[2] in ("role", "content"):
            where += f".{loc[2]}"
        expected = _EXPECTED_BY_MODEL.get(model, _EXPECTED).get(field)
        if first["type"] == "missing":
            msg = f"Missing required parameter '{where}'"
        else:
            text = first["msg"].replace("AnthropicMessage", "a message object")
            msg = f"Invalid value for '{where}': {text.replace('ChatMessage', 'a message object')}"
        if expected:
            msg += f" ('{field}' must be {expected})"
        others = sorted({str(err["loc"][0]) for err in errors if err["loc"]} - {field})
        if others:
            msg += f"; also invalid: {', '.join(others)}"
        raise GatewayError(400, msg, param=field) from None

