"""The model-call request bodies and the session close body, validated with pydantic: standard
fields checked, every other field kept as sent (docs/gateway-protocols.md, "Request bodies")."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError, model_validator

__all__ = [
    "AnthropicMessage",
    "ChatCompletionRequest",
    "ChatMessage",
    "CloseSessionRequest",
    "InvalidRequest",
    "MessagesRequest",
    "ResponsesRequest",
    "WireRequest",
    "validate_request",
]


class InvalidRequest(ValueError):
    """A body that fails its request model: the message, and ``param``, the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# JSON numbers only (an int is a number; a bool or a numeric string is not).
_Temperature = Annotated[float, Field(strict=True, ge=0, le=2)]
_TopP = Annotated[float, Field(strict=True, ge=0, le=1)]
_Unit = Annotated[float, Field(strict=True, ge=0, le=1)]
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class WireRequest(BaseModel):
    """What every model-call body has: ``model`` (a route key) and ``stream``; other keys kept as sent."""

    model_config = ConfigDict(extra="allow")

    # Field order is the order errors are reported in (the first one names ``param``): the
    # fields that decide how the gateway routes and answers come first.
    model: StrictStr
    stream: StrictBool | None = False


class ChatMessage(BaseModel):
    """One entry of ``messages``: an object with a string ``role`` (any role); other keys kept."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr


class ChatCompletionRequest(WireRequest):
    """``POST .../chat/completions`` body (OpenAI API reference, "Create chat completion")."""

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
    """``POST .../responses`` body (OpenAI API reference, "Create a model response")."""

    stream_options: dict[str, Any] | None = None
    input: StrictStr | list[dict[str, Any]] | None = None
    instructions: StrictStr | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    max_output_tokens: _PositiveInt | None = None
    tools: list[dict[str, Any]] | None = None


class AnthropicMessage(BaseModel):
    """One Anthropic message: a string ``role`` and a string or list ``content``; other keys kept."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]]


class MessagesRequest(WireRequest):
    """``POST .../v1/messages`` body (Anthropic API reference, "Messages")."""

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


class ScoreSessionRequest(BaseModel):
    """``POST /v1/sessions/{sid}/score`` body: ``score`` 0..10 or ``reward`` 0..1 (one of them,
    a finite JSON number, never a boolean) and an optional ``reason``."""

    model_config = ConfigDict(extra="forbid")

    score: float | None = Field(default=None, ge=0, le=10, strict=True, allow_inf_nan=False)
    reward: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)
    reason: str | None = Field(default=None, max_length=10_000)

    @model_validator(mode="after")
    def _one_value(self) -> ScoreSessionRequest:
        if (self.score is None) == (self.reward is None):
            raise ValueError("give exactly one of score (0..10) or reward (0..1)")
        return self

    def as_score(self) -> float:
        """The score 0..10 (a reward times 10)."""
        return self.score if self.score is not None else float(self.reward or 0.0) * 10


R = TypeVar("R", bound=WireRequest)


def validate_request(model: type[R], body: dict[str, Any]) -> R:
    """``body`` validated as ``model``; :class:`InvalidRequest` names the field at fault, what was
    expected and what was found."""
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
        raise InvalidRequest(msg, field) from None
