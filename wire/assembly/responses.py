"""Assemble an OpenAI Responses stream into the ``response`` object (the terminal event's, never a
rebuild from deltas unless its ``output`` is empty), and read a response
(docs/gateway-protocols.md, "Responses stream assembly")."""

from __future__ import annotations

from typing import Any

from wire.assembly.base import Answer, as_int, parse_event_json, text_of
from wire.sse import SSEEvent
from wire.status import StepStatus

__all__ = ["TERMINAL_EVENTS", "ResponsesStreamAssembler", "read_responses"]

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
# delta / done event types of text parts: (item list key, part type, text key)
_PART_TEXT = {
    "response.output_text": ("content", "output_text", "text"),
    "response.refusal": ("content", "refusal", "refusal"),
    "response.reasoning_text": ("content", "reasoning_text", "text"),
    "response.reasoning_summary_text": ("summary", "summary_text", "text"),
}


class ResponsesStreamAssembler:
    """Accumulates Responses stream events into one ``response``; :meth:`status` is ``ok``, ``error`` or
    ``truncated``."""

    def __init__(self) -> None:
        self.chunk_count = 0
        self.invalid_count = 0
        self.error: dict[str, Any] | None = None
        self.terminal_type: str | None = None
        self.last_sequence_number: int | None = None
        self.output_from_events = False
        self._snapshot: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        self._items: dict[int, dict[str, Any]] = {}
        self._done_items: set[int] = set()
        self._by_id: dict[str, int] = {}
        self._args: dict[int, list[str]] = {}
        self._args_done: dict[int, str] = {}
        # (output_index, list key, part index) -> [part type, text key, pieces, done text]
        self._parts: dict[tuple[int, str, int], list[Any]] = {}

    @property
    def finished(self) -> bool:
        """True once a terminal event (``response.completed``/``.incomplete``/``.failed``) arrived."""
        return self.terminal_type is not None

    def feed_event(self, ev: SSEEvent) -> Any:
        """Feed one SSE event (its type: the payload's ``type``, else ``event:``); returns its JSON or None.
        A ``[DONE]`` is neither counted nor an end."""
        if ev.data == "[DONE]":
            return None
        self.chunk_count += 1
        obj = parse_event_json(ev.data)
        if not isinstance(obj, dict):
            self.invalid_count += 1
            return obj
        kind = obj.get("type") if isinstance(obj.get("type"), str) else ev.event
        seq = as_int(obj, "sequence_number")
        if seq is not None:
            self.last_sequence_number = seq
        self._feed(kind or "", obj)
        return obj

    def _feed(self, kind: str, obj: dict[str, Any]) -> None:
        response = obj.get("response")
        if kind in _LIFECYCLE and isinstance(response, dict):
            self._snapshot = response
        elif kind in TERMINAL_EVENTS:
            self.terminal_type = kind
            self._final = response if isinstance(response, dict) else None
            if kind == "response.failed":
                err = response.get("error") if isinstance(response, dict) else None
                self.error = dict(err) if isinstance(err, dict) else {"message": "response.failed"}
        elif kind == "error":
            self.error = {k: v for k, v in obj.items() if k not in ("type", "sequence_number")}
        elif kind in ("response.output_item.added", "response.output_item.done"):
            oi = self._index(obj)
            item = obj.get("item")
            if oi is not None and isinstance(item, dict):
                self._items[oi] = dict(item)
                if isinstance(item.get("id"), str):
                    self._by_id[item["id"]] = oi
                if kind.endswith(".done"):
                    self._done_items.add(oi)
        elif kind in (
            "response.content_part.added",
            "response.content_part.done",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_part.done",
        ):
            self._feed_part(kind, obj)
        elif kind in ("response.function_call_arguments.delta", "response.function_call_arguments.done"):
            oi = self._index(obj)
            if oi is not None:
                if kind.endswith(".delta"):
                    piece = text_of(obj.get("delta"))
                    if piece:
                        self._args.setdefault(oi, []).append(piece)
                elif isinstance(obj.get("arguments"), str):
                    self._args_done[oi] = obj["arguments"]
        else:
            prefix, _, suffix = kind.rpartition(".")
            spec = _PART_TEXT.get(prefix)
            if spec is not None and suffix in ("delta", "done"):
                self._feed_text(spec, suffix, obj)

    def _index(self, obj: dict[str, Any]) -> int | None:
        oi = as_int(obj, "output_index")
        if oi is None and isinstance(obj.get("item_id"), str):
            oi = self._by_id.get(obj["item_id"])
        return oi

    def _slot(self, oi: int, key: str, pi: int, part_type: str, text_key: str) -> list[Any]:
        slot = self._parts.get((oi, key, pi))
        if slot is None:
            # [part, text key, text pieces, text of the .done event, logprobs of the deltas]
            slot = self._parts[(oi, key, pi)] = [{"type": part_type, text_key: ""}, text_key, [], None, []]
        return slot

    def _feed_part(self, kind: str, obj: dict[str, Any]) -> None:
        oi = self._index(obj)
        part = obj.get("part")
        summary = "summary_part" in kind
        pi = as_int(obj, "summary_index" if summary else "content_index")
        if oi is None or pi is None or not isinstance(part, dict):
            return
        key = "summary" if summary else "content"
        text_key = "refusal" if part.get("type") == "refusal" else "text"
        slot = self._slot(oi, key, pi, str(part.get("type")), text_key)
        slot[0], slot[1] = dict(part), text_key
        if kind.endswith(".done") and isinstance(part.get(text_key), str):
            slot[3] = part[text_key]

    def _feed_text(self, spec: tuple[str, str, str], suffix: str, obj: dict[str, Any]) -> None:
        key, part_type, text_key = spec
        oi = self._index(obj)
        pi = as_int(obj, "summary_index" if key == "summary" else "content_index")
        if oi is None:
            return
        slot = self._slot(oi, key, pi or 0, part_type, text_key)
        if suffix == "delta":
            piece = text_of(obj.get("delta"))
            if piece:
                slot[2].append(piece)
            if isinstance(obj.get("logprobs"), list):  # include=["message.output_text.logprobs"]
                slot[4].extend(obj["logprobs"])
        else:
            done = obj.get("text") if text_key == "text" else obj.get("refusal")
            if isinstance(done, str):
                slot[3] = done

    # ----------------------------------------------------------------------------- reading
    def status(self) -> StepStatus:
        """``error`` after an ``error`` event or ``response.failed``; ``ok`` after
        ``response.completed``/``response.incomplete``; else ``truncated`` (no terminal event)."""
        if self.error is not None:
            return StepStatus.ERROR
        return StepStatus.OK if self.finished else StepStatus.TRUNCATED

    def notes(self) -> dict[str, Any]:
        """``invalid_events`` and ``output_from_events`` when they apply (read after :meth:`result`)."""
        out: dict[str, Any] = {"invalid_events": self.invalid_count} if self.invalid_count else {}
        if self.output_from_events:
            out["output_from_events"] = True
        return out

    def output(self) -> list[dict[str, Any]]:
        """The output items accumulated from the events, by ``output_index``."""
        out = []
        for oi in sorted(self._items):
            item = dict(self._items[oi])
            if oi not in self._done_items:
                if item.get("type") == "function_call":
                    args = self._args_done.get(oi)
                    if args is None and oi in self._args:
                        args = "".join(self._args[oi])
                    if args is not None:
                        item["arguments"] = args
                for key in ("content", "summary"):
                    parts = sorted(
                        (pi, slot) for (o, k, pi), slot in self._parts.items() if o == oi and k == key
                    )
                    if not parts:
                        continue
                    lst = list(item.get(key) or [])
                    for pi, (part, text_key, pieces, done, logprobs) in parts:
                        while len(lst) <= pi:
                            lst.append(None)
                        text = done if done is not None else (part.get(text_key) or "") + "".join(pieces)
                        lst[pi] = {**part, text_key: text}
                        if logprobs and not part.get("logprobs"):
                            lst[pi]["logprobs"] = logprobs
                    item[key] = [p for p in lst if p is not None]
            out.append(item)
        return out

    def result(self) -> dict[str, Any]:
        """The ``response`` object: the terminal event's response when one arrived (see the module
        docstring), else the last lifecycle snapshot with the accumulated output."""
        if self._final is not None:
            final = dict(self._final)
            if not final.get("output") and self._items:
                final["output"] = self.output()
                self.output_from_events = True
            return final
        base = dict(self._snapshot or {"object": "response"})
        base["output"] = self.output()
        return base


def read_responses(response: Any) -> Answer:
    """The :class:`Answer` of a Responses ``response`` object."""
    if not isinstance(response, dict):
        return Answer()
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    output = response.get("output")
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            texts += [
                p["text"]
                for p in item.get("content") or []
                if isinstance(p, dict) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
            ]
        elif kind == "reasoning":
            parts = [p.get("text") for p in item.get("content") or [] if isinstance(p, dict)]
            if not any(isinstance(t, str) for t in parts):
                parts = [p.get("text") for p in item.get("summary") or [] if isinstance(p, dict)]
            reasoning += [t for t in parts if isinstance(t, str)]
        elif kind == "function_call":
            args = item.get("arguments")
            calls.append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "type": "function",
                    "function": {
                        "name": item.get("name"),
                        "arguments": args if isinstance(args, str) else text_of(args) or "",
                    },
                }
            )
    status = response.get("status")
    details = response.get("incomplete_details")
    finish = status if isinstance(status, str) else None
    if status == "incomplete" and isinstance(details, dict) and isinstance(details.get("reason"), str):
        finish = details["reason"]
    usage = response.get("usage")
    prompt, completion = as_int(usage, "input_tokens"), as_int(usage, "output_tokens")
    total = as_int(usage, "total_tokens")
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    return Answer(
        content="".join(texts) if texts else None,
        reasoning="".join(reasoning) if reasoning else None,
        tool_calls=calls,
        finish_reason=finish,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
    )
