"""Prefix continuity: does a step's prompt extend the previous step's prompt + completion?
:class:`PrefixTracker` keeps per session fingerprints of the last ``ok`` step, never the
conversation (the rule: docs/tokens.md, "Prefix continuity")."""

from __future__ import annotations

import hashlib
import marshal
from dataclasses import dataclass
from typing import Any

from store.stepcodec import TokenChain, message_digest

__all__ = ["PrefixTracker", "canonical_message"]


@dataclass(frozen=True, slots=True)
class _Prefix:
    """The last ``ok`` step: its message count (answer included), the SHA-256 state of their canonical
    forms, and the exact digests of its messages and answer."""

    seq: int
    tokens: TokenChain | None
    msg_count: int | None
    msg_digest: bytes | None
    tools_digest: bytes
    hasher: Any = None
    exact: tuple[bytes, ...] | None = None
    answer: bytes | None = None


def _text_or_parts(content: Any) -> Any:
    """A message content as a comparable value: a string as is (None as ""), a list of parts
    whose parts are all text joined into one string, any other list kept part by part."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") in ("text", "input_text", "output_text")
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
            else:
                return content
        return "".join(texts)
    return content


def canonical_message(message: Any) -> Any:
    """What of a chat message reaches the model: role, content, reasoning, tool calls as ``[id, name,
    arguments]``, ``tool_call_id`` and ``name``; keys echoed with null values do not count."""
    if not isinstance(message, dict):
        return message
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        calls.append([c.get("id") if isinstance(c, dict) else None, fn.get("name"), fn.get("arguments")])
    return [
        message.get("role"),
        _text_or_parts(message.get("content")),
        reasoning,
        calls,
        message.get("tool_call_id"),
        message.get("name"),
    ]


def _message_bytes(message: Any) -> bytes:
    """The canonical message as bytes (``marshal`` format 2: no back-references, so equal
    values give equal bytes; a third of the cost of ``json.dumps``)."""
    return marshal.dumps(canonical_message(message), 2)


class PrefixTracker:
    """Per-session digests of the last ``ok`` step (see the module docstring)."""

    def __init__(self) -> None:
        self._last: dict[str, _Prefix] = {}

    def __len__(self) -> int:
        return len(self._last)

    def drop(self, session_id: str) -> None:
        """Forget a session (closed)."""
        self._last.pop(session_id, None)

    def observe(
        self,
        session_id: str,
        seq: int,
        *,
        ok: bool,
        prompt_ids: list[int] | None,
        tokens: TokenChain | None,
        messages: Any,
        answer_message: dict[str, Any] | None,
        tools: Any,
        digests: tuple[bytes, ...] | None = None,
    ) -> bool | None:
        """``extends_prefix`` of step ``seq`` (None: no previous step or nothing comparable), then remember
        the step when it is ``ok``. ``tokens``: its :func:`store.stepcodec.token_chain`; ``digests``:
        :func:`store.stepcodec.message_digests` of ``messages``, when the caller has them."""
        prev = None if seq <= 1 else self._last.get(session_id)
        if prev is not None and prev.seq >= seq:
            prev = None
        tools_digest = hashlib.sha256(marshal.dumps(tools, 2)).digest()
        result: bool | None = None
        if (
            prev is not None
            and prompt_ids is not None
            and tokens is not None
            and prev.tokens is not None
            and prev.tokens.complete
        ):
            result = tokens.prompt_starts_with(prompt_ids, prev.tokens)
        msg_list = messages if isinstance(messages, list) else None
        if msg_list is not None and digests is not None and len(digests) != len(msg_list):
            digests = None
        h = hashlib.sha256()
        if msg_list is not None:
            want = prev.msg_count if prev is not None and prev.msg_digest is not None else None
            if (
                want is not None
                and prev is not None
                and prev.exact is not None
                and digests is not None
                and len(digests) >= want
                and digests[want - 1] == prev.answer
                and digests[: want - 1] == prev.exact
            ):
                h = prev.hasher.copy()  # the same history exactly: canonically the same
                for m in msg_list[want:]:
                    h.update(_message_bytes(m))
                if result is None:
                    result = tools_digest == prev.tools_digest
            else:
                if result is not None:
                    want = None
                snap: bytes | None = None
                for i, m in enumerate(msg_list):
                    if i == want:
                        snap = h.copy().digest()
                    h.update(_message_bytes(m))
                if want is not None and len(msg_list) == want:
                    snap = h.copy().digest()
                if prev is not None and want is not None:
                    result = (
                        snap is not None and snap == prev.msg_digest and tools_digest == prev.tools_digest
                    )
        if not ok:
            return result
        if seq <= 1:
            self._last.pop(session_id, None)
        elif (have := self._last.get(session_id)) is not None and have.seq >= seq:
            return result
        if msg_list is not None and answer_message is not None:
            h.update(_message_bytes(answer_message))
            self._last[session_id] = _Prefix(
                seq,
                tokens,
                len(msg_list) + 1,
                h.copy().digest(),
                tools_digest,
                h,
                digests,
                message_digest(answer_message) if digests is not None else None,
            )
        else:
            self._last[session_id] = _Prefix(seq, tokens, None, None, tools_digest)
        return result
