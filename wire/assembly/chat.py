"""Assemble a streamed chat completion into the ``chat.completion`` object, accepting the
variations OpenAI-compatible servers add (docs/gateway-protocols.md, "Chat stream assembly")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from wire.assembly.base import Answer, as_int, parse_event_json, text_of
from wire.sse import SSEEvent
from wire.status import StepStatus

__all__ = ["ChatStreamAssembler", "message_of", "read_chat", "reasoning_of", "usage_of"]

# Top-level chunk keys handled explicitly; every other key is a vendor extra kept from the last
# chunk that had a non-null value for it.
_TOP_HANDLED = frozenset({"id", "object", "created", "model", "choices", "usage", "prompt_token_ids"})
# Choice-level keys handled explicitly; others are kept (last non-null) in the assembled choice.
_CHOICE_HANDLED = frozenset({"index", "delta", "finish_reason", "logprobs", "token_ids", "message"})
# Delta keys handled explicitly; others are kept (last non-null) in the assembled message.
_DELTA_HANDLED = frozenset(
    {"role", "content", "reasoning", "reasoning_content", "tool_calls", "refusal", "function_call"}
)


@dataclass(slots=True)
class _ToolCall:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    args: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type or "function",
            "function": {"name": self.name, "arguments": "".join(self.args)},
        }


@dataclass(slots=True)
class _Choice:
    index: int
    role: str | None = None
    content: list[str] | None = None
    reasoning: list[str] | None = None
    refusal: list[str] | None = None
    function_call: _ToolCall | None = None
    calls: list[_ToolCall] = field(default_factory=list)
    calls_by_index: dict[Any, _ToolCall] = field(default_factory=dict)
    calls_by_id: dict[str, _ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: dict[str, list[Any]] | None = None
    token_ids: list[Any] | None = None
    msg_extras: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


_text = text_of


class ChatStreamAssembler:
    """Accumulates ``chat.completion.chunk`` objects into the ``chat.completion`` a non-streaming call
    would have returned: :meth:`feed_chunk` each JSON object, :meth:`feed_done` at ``[DONE]`` (or
    :meth:`feed_data` for both), then :meth:`result`. Merge rules: docs/gateway-protocols.md."""

    def __init__(self) -> None:
        self.saw_done: bool = False
        self.error: dict[str, Any] | None = None
        self.chunk_count: int = 0
        self.invalid_count: int = 0
        self.usage: dict[str, Any] | None = None
        self.prompt_token_ids: list[Any] | None = None
        self._id: str | None = None
        self._created: int | None = None
        self._model: str | None = None
        self._extras: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}

    # ----------------------------------------------------------------------------- feeding
    @property
    def finished(self) -> bool:
        """True once ``[DONE]`` arrived (the event the forwarding core holds back until the step
        is recorded)."""
        return self.saw_done

    def feed_event(self, ev: SSEEvent) -> Any:
        """Feed one SSE event: ``[DONE]`` ends the stream; JSON is fed and returned; other data counts in
        ``invalid_count`` (None)."""
        if ev.data == "[DONE]":
            self.feed_done()
            return None
        obj = parse_event_json(ev.data)
        if isinstance(obj, dict):
            self.feed_chunk(obj)
            return obj
        self.invalid_count += 1
        return None

    def feed_data(self, data: str) -> None:
        """Feed the text of one SSE ``data`` payload: ``[DONE]`` goes to :meth:`feed_done`,
        JSON to :meth:`feed_chunk`; text that is not JSON counts in ``invalid_count``."""
        if data.strip() == "[DONE]":
            self.feed_done()
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.invalid_count += 1
            return
        self.feed_chunk(obj)

    def feed_done(self) -> None:
        """Record the ``data: [DONE]`` sentinel that ends an OpenAI chat stream."""
        self.saw_done = True

    def feed_chunk(self, obj: Any) -> None:
        """Accumulate one parsed ``chat.completion.chunk`` (or an in-stream error object)."""
        self.chunk_count += 1
        if not isinstance(obj, dict):
            self.invalid_count += 1
            return
        choices = obj.get("choices")
        if not choices and (obj.get("error") is not None or obj.get("object") == "error"):
            self._set_error(obj)
            return
        for key, value in obj.items():
            if key in _TOP_HANDLED or value is None:
                continue
            self._extras[key] = value
        # id/created/model: the last non-empty value (Azure's first chunk has "", 0, "").
        if obj.get("id") or (self._id is None and obj.get("id") is not None):
            self._id = obj["id"]
        if obj.get("created") or (self._created is None and obj.get("created") is not None):
            self._created = obj["created"]
        if obj.get("model") or (self._model is None and obj.get("model") is not None):
            self._model = obj["model"]
        if obj.get("usage") is not None:
            self.usage = obj["usage"]
        if self.prompt_token_ids is None and isinstance(obj.get("prompt_token_ids"), list):
            self.prompt_token_ids = list(obj["prompt_token_ids"])
        if isinstance(choices, list):
            for position, choice in enumerate(choices):
                if isinstance(choice, dict):
                    self._feed_choice(choice, position)

    def _set_error(self, obj: dict[str, Any]) -> None:
        err = obj.get("error")
        if isinstance(err, dict):
            self.error = dict(err)
        elif err is not None and obj.get("object") != "error":
            self.error = {"message": str(err)}
        else:
            # vLLM's older shape: {"object": "error", "message", "type", "param", "code"}
            self.error = {k: v for k, v in obj.items() if k != "object"}

    def _choice(self, index: int) -> _Choice:
        ch = self._choices.get(index)
        if ch is None:
            ch = self._choices[index] = _Choice(index=index)
        return ch

    def _feed_choice(self, choice: dict[str, Any], position: int) -> None:
        index = choice.get("index")
        ch = self._choice(index if isinstance(index, int) else position)
        for key, value in choice.items():
            if key not in _CHOICE_HANDLED and value is not None:
                ch.extras[key] = value
        if choice.get("finish_reason") is not None:
            ch.finish_reason = choice["finish_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if ch.logprobs is None:
                ch.logprobs = {}
            for key in ("content", "refusal"):
                if isinstance(logprobs.get(key), list):
                    ch.logprobs.setdefault(key, []).extend(logprobs[key])
        if isinstance(choice.get("token_ids"), list):
            if ch.token_ids is None:
                ch.token_ids = []
            ch.token_ids.extend(choice["token_ids"])
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._feed_delta(ch, delta)

    def _feed_delta(self, ch: _Choice, delta: dict[str, Any]) -> None:
        if ch.role is None and delta.get("role"):
            ch.role = delta["role"]
        content = _text(delta.get("content"))
        if content is not None:
            if ch.content is None:
                ch.content = []
            ch.content.append(content)
        r1 = _text(delta.get("reasoning"))
        r2 = _text(delta.get("reasoning_content"))
        if r1 is not None and r1 == r2:
            r2 = None  # the same text under both names in one delta: count it once
        for part in (r1, r2):
            if part is not None:
                if ch.reasoning is None:
                    ch.reasoning = []
                ch.reasoning.append(part)
        refusal = _text(delta.get("refusal"))
        if refusal is not None:
            if ch.refusal is None:
                ch.refusal = []
            ch.refusal.append(refusal)
        fc = delta.get("function_call")
        if isinstance(fc, dict):  # legacy (pre-tool_calls) function calling
            if ch.function_call is None:
                ch.function_call = _ToolCall()
            self._merge_call(ch.function_call, fc)
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            entries = [e for e in tool_calls if isinstance(e, dict)]
            m = len(entries)
            # Several entries, none with an index or id: parallel calls streamed side by side
            # by a server that omits `index`; entry k of m continues the k-th of the last m calls.
            side_by_side = (
                m > 1
                and len(ch.calls) >= m
                and all(e.get("index") is None and not e.get("id") for e in entries)
            )
            for k, entry in enumerate(entries):
                hint = ch.calls[len(ch.calls) - m + k] if side_by_side else None
                self._feed_tool_call(ch, entry, hint)
        for key, value in delta.items():
            if key not in _DELTA_HANDLED and value is not None:
                ch.msg_extras[key] = value

    def _feed_tool_call(self, ch: _Choice, entry: dict[str, Any], hint: _ToolCall | None) -> None:
        index = entry.get("index")
        call_id = entry.get("id") or None
        fn = entry.get("function")
        fn = fn if isinstance(fn, dict) else {}
        call: _ToolCall | None
        if index is not None:
            call = ch.calls_by_index.get(index)
            if call is not None and call_id and call.id and call_id != call.id:
                call = None  # a different id under a reused index: never merge two calls
            if call is None:
                call = ch.calls_by_id.get(call_id) if call_id else None
            if call is None:
                call = _ToolCall()
                ch.calls.append(call)
            ch.calls_by_index[index] = call
        else:
            call = ch.calls_by_id.get(call_id) if call_id else None
            if call is None:
                target = hint if hint is not None else (ch.calls[-1] if ch.calls else None)
                name = fn.get("name")
                if (
                    target is None
                    or (call_id and target.id and call_id != target.id)
                    or (name and target.name and name != target.name)
                ):
                    call = _ToolCall()  # a new id (or another function name) starts a new call
                    ch.calls.append(call)
                else:
                    call = target  # no index and no new id: extend the last open call
        self._merge_call(call, fn, call_id, entry.get("type"))
        if call.id and call.id not in ch.calls_by_id:
            ch.calls_by_id[call.id] = call

    @staticmethod
    def _merge_call(
        call: _ToolCall, fn: dict[str, Any], call_id: str | None = None, type_: Any = None
    ) -> None:
        if call.id is None and call_id:
            call.id = call_id
        if call.type is None and type_:
            call.type = type_
        name = fn.get("name")
        if call.name is None and name:
            call.name = name  # later names (repeated by some servers) are not appended
        args = _text(fn.get("arguments"))
        if args:
            call.args.append(args)

    # ----------------------------------------------------------------------------- reading
    def content(self, choice: int = 0) -> str | None:
        """Joined ``delta.content`` of a choice, or None if no content string arrived."""
        ch = self._choices.get(choice)
        return None if ch is None or ch.content is None else "".join(ch.content)

    def reasoning(self, choice: int = 0) -> str | None:
        """Joined ``delta.reasoning`` / ``delta.reasoning_content`` text of a choice, or None."""
        ch = self._choices.get(choice)
        return None if ch is None or ch.reasoning is None else "".join(ch.reasoning)

    def tool_calls(self, choice: int = 0) -> list[dict[str, Any]]:
        """Assembled tool calls of a choice, in first-seen order:
        ``[{"id", "type", "function": {"name", "arguments"}}]`` ([] when none)."""
        ch = self._choices.get(choice)
        return [] if ch is None else [c.as_dict() for c in ch.calls]

    def finish_reason(self, choice: int = 0) -> str | None:
        """Last non-null ``finish_reason`` of a choice, or None."""
        ch = self._choices.get(choice)
        return None if ch is None else ch.finish_reason

    def status(self) -> StepStatus:
        """``error`` after an in-stream error object; else ``ok`` when the stream ended with
        ``[DONE]`` or some choice has a finish_reason; else ``truncated`` (EOF mid-stream)."""
        if self.error is not None:
            return StepStatus.ERROR
        if self.saw_done or any(ch.finish_reason is not None for ch in self._choices.values()):
            return StepStatus.OK
        return StepStatus.TRUNCATED

    def notes(self) -> dict[str, Any]:
        """Extra ``meta_json`` keys: ``invalid_events`` when some event was not JSON."""
        return {"invalid_events": self.invalid_count} if self.invalid_count else {}

    def result(self) -> dict[str, Any]:
        """The assembled ``chat.completion`` object (see the class docstring for its shape). May
        be called at any time; each call builds a new dict."""
        choices = []
        for index in sorted(self._choices):
            ch = self._choices[index]
            message: dict[str, Any] = {
                "role": ch.role or "assistant",
                "content": None if ch.content is None else "".join(ch.content),
            }
            if ch.reasoning is not None:
                message["reasoning_content"] = "".join(ch.reasoning)
            if ch.refusal is not None:
                message["refusal"] = "".join(ch.refusal)
            if ch.function_call is not None:
                message["function_call"] = {
                    "name": ch.function_call.name,
                    "arguments": "".join(ch.function_call.args),
                }
            if ch.calls:
                message["tool_calls"] = [c.as_dict() for c in ch.calls]
            for key, value in ch.msg_extras.items():
                message.setdefault(key, value)
            out: dict[str, Any] = {
                "index": index,
                "message": message,
                "finish_reason": ch.finish_reason,
                "logprobs": ch.logprobs,
            }
            if ch.token_ids is not None:
                out["token_ids"] = list(ch.token_ids)
            for key, value in ch.extras.items():
                out.setdefault(key, value)
            choices.append(out)
        result: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            "usage": self.usage,
        }
        if self.prompt_token_ids is not None:
            result["prompt_token_ids"] = list(self.prompt_token_ids)
        for key, value in self._extras.items():
            result.setdefault(key, value)
        return result


def message_of(response: Any) -> dict[str, Any]:
    """``choices[0].message`` of a non-streaming ``chat.completion`` object, or ``{}`` when the
    response has no such message (error bodies, empty choices, non-dict input)."""
    if not isinstance(response, dict):
        return {}
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return {}
    message = choices[0].get("message")
    return message if isinstance(message, dict) else {}


def usage_of(response: Any) -> dict[str, Any] | None:
    """The ``usage`` object of a ``chat.completion`` (or chunk), or None when absent/null."""
    if not isinstance(response, dict):
        return None
    usage = response.get("usage")
    return usage if isinstance(usage, dict) else None


def reasoning_of(message: Any) -> str | None:
    """Reasoning text of a non-streaming message: ``reasoning_content`` (DeepSeek, older vLLM)
    or ``reasoning`` (newer vLLM), whichever is a non-empty string first; else None."""
    if not isinstance(message, dict):
        return None
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def read_chat(response: Any) -> Answer:
    """The :class:`Answer` of a ``chat.completion`` (choice 0); an empty one for anything else."""
    message = message_of(response)
    content = message.get("content")
    calls = message.get("tool_calls")
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    finish = first.get("finish_reason")
    usage = usage_of(response)
    return Answer(
        content=content if isinstance(content, str) else None,
        reasoning=reasoning_of(message),
        tool_calls=[c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else [],
        finish_reason=finish if isinstance(finish, str) else None,
        prompt_tokens=as_int(usage, "prompt_tokens"),
        completion_tokens=as_int(usage, "completion_tokens"),
        total_tokens=as_int(usage, "total_tokens"),
    )
