"""Token in, token out: per session, the token ids so far. A request whose messages extend the
previous request's messages + the reply sampled for it gets as prompt those ids (previous prompt +
completion) followed by only the new messages' rendering; any other request of a known session
is rendered whole, marked and counted (docs/training.md, "Token in, token out")."""

from __future__ import annotations

import json
import logging
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.continuity import canonical_message
from rollout.train.sampling import Engine

__all__ = ["Continuity", "SessionPrompts"]

log = logging.getLogger(__name__)

Mode = Literal["continued", "rendered", "fallback"]
_SENTINEL = "\x00rollout-factory-assistant-content\x00"


@dataclass(frozen=True)
class Continuity:
    """How a prompt was made: ``continued`` (the session's ids + the new messages), ``rendered``
    (the whole chat rendered: a session's first call, or no session id), ``fallback`` (rendered
    whole although the session has kept ids; ``reason`` says why)."""

    mode: Mode
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason}


@dataclass
class _Kept:
    asked: list[Any]  # canonical messages of the last request
    asked_ids: array[int]  # its prompt ids (8 bytes an id, not a list of int objects)
    through: list[Any]  # canonical messages of the last request + its reply
    ids: array[int]  # its prompt ids + completion ids
    rendered: str | None  # the template's text of ``through`` (no generation prompt)
    closing: str | None  # what the template writes after the reply that the model did not sample
    tools: str


def _tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


def _has_assistant(canon: Sequence[Any]) -> bool:
    return any(isinstance(m, list) and m and m[0] == "assistant" for m in canon)


class SessionPrompts:
    """The prompt ids of each request, continuing its session's ids when its messages allow.
    ``counts`` holds the prompts per mode, ``reasons`` the fallbacks per reason; at most
    ``max_sessions`` sessions are kept (least recently used dropped, counted in ``evicted``)."""

    def __init__(self, engine: Engine, *, max_sessions: int = 4096) -> None:
        self.engine, self.max_sessions = engine, max_sessions
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self.counts: Counter[str] = Counter({"continued": 0, "rendered": 0, "fallback": 0})
        self.reasons: Counter[str] = Counter()
        self.evicted = 0

    def stats(self) -> dict[str, Any]:
        """The counters as JSON (``GET /stats``)."""
        return {
            "prompts": dict(self.counts),
            "fallback_reasons": dict(self.reasons),
            "sessions": len(self._kept),
            "evicted": self.evicted,
        }

    def prompt(
        self, session_id: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[int], Continuity]:
        """The prompt ids for this request and how they were made (counted)."""
        ids, how = self._prompt(session_id, messages, tools)
        self.counts[how.mode] += 1
        if how.mode == "fallback":
            self.reasons[str(how.reason)] += 1
            log.warning("session %s: prompt rendered whole: %s", session_id, how.reason)
        return ids, how

    def _prompt(
        self, session_id: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[int], Continuity]:
        if session_id is None:
            return self.engine.prompt_ids(messages, tools), Continuity("rendered", "no session id")
        canon = [canonical_message(m) for m in messages]
        kept = self._kept.get(session_id)
        if kept is None:
            if _has_assistant(canon):
                return self.engine.prompt_ids(messages, tools), Continuity(
                    "fallback",
                    "no kept token ids for a history with an assistant turn (its first call here, "
                    "a restarted server or an evicted session)",
                )
            return self.engine.prompt_ids(messages, tools), Continuity("rendered")
        self._kept.move_to_end(session_id)
        why = self._mismatch(kept, canon, tools)
        if why == "same":  # the previous request again (a retry): the same prompt
            return list(kept.asked_ids), Continuity("continued")
        if why is not None:
            return self.engine.prompt_ids(messages, tools), Continuity("fallback", why)
        text = self.engine.render(messages, tools, True)
        if kept.rendered is None or kept.closing is None:
            return self.engine.encode(text), Continuity(
                "fallback", "the chat template's end of an assistant turn is unknown (its content not found)"
            )
        if not text.startswith(kept.rendered):
            return self.engine.encode(text), Continuity(
                "fallback", "the chat template renders the earlier turns differently in the longer chat"
            )
        return [*kept.ids, *self.engine.encode(kept.closing + text[len(kept.rendered) :])], Continuity(
            "continued"
        )

    @staticmethod
    def _mismatch(kept: _Kept, canon: list[Any], tools: list[dict[str, Any]] | None) -> str | None:
        """None when ``canon`` extends the kept messages + reply, ``"same"`` when it is the last
        request again, else the reason it does not extend them."""
        if _tools_key(tools) != kept.tools:
            return "the tools changed"
        if canon == kept.asked:
            return "same"
        n = len(kept.through)
        if canon[:n] == kept.through:
            return None
        first = next((i for i, (a, b) in enumerate(zip(canon, kept.through, strict=False)) if a != b), None)
        if first is None:
            return "the history is shorter than the previous request + its reply"
        if first == n - 1:
            return f"messages[{first}] is not the assistant reply sampled for the previous request"
        return f"messages[{first}] differs from the previous request's (history edited)"

    def keep(
        self,
        session_id: str | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        reply: dict[str, Any],
    ) -> None:
        """After a generation: keep the session's ids (prompt + completion) and messages (+ reply)."""
        if session_id is None:
            return
        through = [*messages, reply]
        try:
            rendered: str | None = self.engine.render(through, tools, False)
            probe = self.engine.render([*messages, {"role": "assistant", "content": _SENTINEL}], tools, False)
        except Exception as e:  # a template that refuses the reply: the next call is a counted fallback
            log.warning("session %s: the chat template cannot render the reply: %s", session_id, e)
            rendered = probe = None
        closing = None
        if probe is not None and _SENTINEL in probe:
            closing = probe[probe.index(_SENTINEL) + len(_SENTINEL) :]
            last = completion_ids[-1] if completion_ids else None
            if last is not None and last in self.engine.eos_ids:
                eos = self.engine.token_text(last)
                if closing.startswith(eos):
                    closing = closing[len(eos) :]  # the model sampled the turn's end itself
        canon = [canonical_message(m) for m in messages]
        self._kept[session_id] = _Kept(
            asked=canon,
            asked_ids=array("q", prompt_ids),
            through=[*canon, canonical_message(reply)],
            ids=array("q", [*prompt_ids, *completion_ids]),
            rendered=rendered,
            closing=closing,
            tools=_tools_key(tools),
        )
        self._kept.move_to_end(session_id)
        while len(self._kept) > self.max_sessions:
            self._kept.popitem(last=False)
            self.evicted += 1
