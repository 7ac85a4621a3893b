"""Recorded steps turned into what a page shows: messages as parts (text, tool calls, tool results,
reasoning), the model's answer, the start request as the agent saw it, and where the samples of a
group diverge. Pure data code: no HTTP, no SQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wire.assembly import read_answer
from wire.text import json_text

PREVIEW_CHARS = 160


@dataclass
class Part:
    """One piece of a message: ``kind`` is text | tool_call | tool_result | reasoning | image | json;
    ``title`` names it (a tool's name and call id), ``text`` is the full text."""

    kind: str
    text: str
    title: str = ""

    @property
    def preview(self) -> str:
        """The first line, cut to ``PREVIEW_CHARS``."""
        line = self.text.strip().split("\n", 1)[0]
        return line if len(line) <= PREVIEW_CHARS else line[:PREVIEW_CHARS] + "…"

    @property
    def lines(self) -> int:
        return self.text.count("\n") + 1 if self.text else 0


@dataclass
class Message:
    role: str
    parts: list[Part] = field(default_factory=list)


@dataclass
class StepView:
    """One recorded step ready for a template: its row, the conversation it was sent (``messages``;
    the first ``new_from`` of them repeat the previous step's, see :func:`step_views`), the answer
    (``answer``: parts) and the upstream attempts of the call (``retries``, when recorded)."""

    row: dict[str, Any]
    messages: list[Message]
    new_from: int
    answer: list[Part]
    retries: int | None

    @property
    def signature(self) -> str:
        """What the model answered, as one string (text and tool calls): equal answers, equal strings."""
        return json.dumps([(p.kind, p.title, p.text) for p in self.answer], ensure_ascii=False)


def pretty(value: Any) -> str:
    """A JSON value as indented text; a string that holds JSON is indented too."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict | list):
            return json_text(parsed, indent=2)
        return value
    return json_text(value, indent=2, default=str)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.text for p in _content_parts(content))
    return pretty(content)


def _tool_call_part(call: Any) -> Part:
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict):
        title = f"{fn.get('name') or '?'} · {call.get('id') or ''}".rstrip(" ·")
        return Part("tool_call", pretty(fn.get("arguments") or ""), title)
    return Part("tool_call", pretty(call), "tool call")


def _content_parts(content: list[Any]) -> list[Part]:
    parts: list[Part] = []
    for item in content:
        if isinstance(item, str):
            parts.append(Part("text", item))
            continue
        if not isinstance(item, dict):
            parts.append(Part("json", pretty(item)))
            continue
        kind = item.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(Part("text", str(item.get("text") or "")))
        elif kind in ("thinking", "reasoning", "redacted_thinking"):
            parts.append(Part("reasoning", str(item.get("thinking") or item.get("text") or pretty(item))))
        elif kind in ("image_url", "input_image", "image"):
            parts.append(Part("image", "(image)"))
        elif kind == "tool_use":
            parts.append(
                Part("tool_call", pretty(item.get("input")), f"{item.get('name')} · {item.get('id')}")
            )
        elif kind == "tool_result":
            parts.append(
                Part(
                    "tool_result", _content_text(item.get("content")), f"result of {item.get('tool_use_id')}"
                )
            )
        else:
            parts.append(Part("json", pretty(item)))
    return parts


def message_of(raw: Any) -> Message:
    """A request message of any of the three protocols (chat message, Responses input item,
    Anthropic message) as a :class:`Message`."""
    if not isinstance(raw, dict):
        return Message("?", [Part("text" if isinstance(raw, str) else "json", _content_text(raw))])
    kind = raw.get("type")
    if kind == "function_call":  # Responses input item
        return Message(
            "assistant",
            [
                Part(
                    "tool_call",
                    pretty(raw.get("arguments") or ""),
                    f"{raw.get('name')} · {raw.get('call_id')}",
                )
            ],
        )
    if kind == "function_call_output":
        return Message(
            "tool", [Part("tool_result", _content_text(raw.get("output")), f"result of {raw.get('call_id')}")]
        )
    role = str(raw.get("role") or kind or "?")
    content = raw.get("content")
    if role == "tool":
        parts = [Part("tool_result", _content_text(content), f"result of {raw.get('tool_call_id') or '?'}")]
    elif isinstance(content, list):
        parts = _content_parts(content)
    else:
        parts = [Part("text", _content_text(content))] if content not in (None, "") else []
    for key in ("reasoning_content", "reasoning"):
        if isinstance(raw.get(key), str) and raw[key]:
            parts.insert(0, Part("reasoning", raw[key]))
    parts.extend(_tool_call_part(c) for c in raw.get("tool_calls") or [])
    return Message(role, parts)


def answer_parts(endpoint: str | None, response: Any) -> list[Part]:
    """The model's answer of a step: reasoning, text and tool calls (empty for no answer)."""
    if not isinstance(response, dict):
        return []
    answer = read_answer(endpoint, response)
    parts: list[Part] = []
    if answer.reasoning:
        parts.append(Part("reasoning", answer.reasoning))
    if answer.content:
        parts.append(Part("text", answer.content))
    parts.extend(_tool_call_part(c) for c in answer.tool_calls)
    return parts


def _resent(prev: list[Any], prev_answer: Any, cur: list[Any]) -> int:
    """How many leading messages of ``cur`` repeat the previous step's conversation (and then its
    answer, re-sent as an assistant message): the length of the common prefix."""
    n = 0
    while n < len(prev) and n < len(cur) and prev[n] == cur[n]:
        n += 1
    if (
        n == len(prev)
        and n < len(cur)
        and isinstance(cur[n], dict)
        and cur[n].get("role") == "assistant"
        and prev_answer is not None
    ):
        n += 1  # the previous answer, shown with the previous step
    return n


def _answer_message(endpoint: str | None, response: Any) -> Any:
    if not isinstance(response, dict):
        return None
    return read_answer(endpoint, response)


def step_views(rows: Sequence[dict[str, Any]]) -> list[StepView]:
    """Views of a session's steps (in ``seq`` order). ``new_from`` of a step counts the messages
    it re-sent unchanged from the previous step (plus that step's answer); a conversation the
    agent rewrote (trimmed, summarised) shows from the first changed message."""
    views: list[StepView] = []
    prev: list[Any] = []
    prev_answer: Any = None
    for row in rows:
        value = row.get("messages")
        raw: list[Any] = value if isinstance(value, list) else []
        meta = row.get("meta_json") or {}
        retries = (
            meta.get("attempts") if isinstance(meta, dict) and isinstance(meta.get("attempts"), int) else None
        )
        views.append(
            StepView(
                row=row,
                messages=[message_of(m) for m in raw],
                new_from=_resent(prev, prev_answer, raw),
                answer=answer_parts(row.get("endpoint"), row.get("response")),
                retries=retries,
            )
        )
        prev, prev_answer = raw, _answer_message(row.get("endpoint"), row.get("response"))
    return views


def divergence(samples: Sequence[Sequence[StepView]]) -> tuple[int | None, list[int | None]]:
    """Where the samples of a group stop answering alike.

    Returns ``(common, first_diff)``: ``common`` is the 1-based index of the first step at which
    not all samples gave the same answer (None when all answers are identical and the trajectories
    have equal length); ``first_diff[i]`` is the first step at which sample ``i`` differs from
    sample 0 (None when identical; a trajectory that ends earlier differs at its end + 1)."""
    if not samples:
        return None, []
    base = samples[0]

    def first_diff(other: Sequence[StepView]) -> int | None:
        for i in range(max(len(base), len(other))):
            if i >= len(base) or i >= len(other) or base[i].signature != other[i].signature:
                return i + 1
        return None

    diffs = [first_diff(s) for s in samples]
    known = [d for d in diffs if d is not None]
    return (min(known) if known else None), diffs


def start_request_view(row: dict[str, Any], hidden: Sequence[str] | None) -> dict[str, Any]:
    """The start request the runtime was given, rebuilt from the session row: the case row without
    its ``hidden`` fields. ``hidden`` None (the env's config was not found) leaves the case row out
    altogether rather than risk showing a hidden field."""
    env_params = dict(row.get("env_params") or {})
    dataset = env_params.get("dataset")
    if hidden is None:
        env_params["dataset"] = (
            "(not shown: the env's config was not found, so its hidden fields are unknown)"
        )
    elif isinstance(dataset, dict):
        env_params["dataset"] = {k: v for k, v in dataset.items() if k not in set(hidden)}
    return {
        "job_id": row.get("job_id"),
        "session_id": row.get("env_id"),
        "agent_name": row.get("env_name"),
        "agent_id": f"{row.get('env_name')}-{row.get('sample_index')}",
        "group_id": row.get("group_id"),
        "model": row.get("llm_model"),
        "max_steps": row.get("max_steps") if row.get("max_steps") is not None else -1,
        "env_params": env_params,
        "metadata": {"case_id": row.get("case_id"), "sample_index": row.get("sample_index")},
    }
