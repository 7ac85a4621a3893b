"""Stream assembly and answer reading for the three protocols (chat, Responses, Anthropic
Messages): a stream assembler per protocol (:class:`wire.assembly.base.StreamAssembler`) and a
reader of a finished answer into an :class:`Answer`. :func:`read_answer` picks the reader by the
step's ``endpoint``; the promoted step columns and the launcher's trajectory builder both use it.
Pure data code (no HTTP). Rules: docs/gateway-protocols.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wire.assembly.anthropic import MessagesStreamAssembler, read_messages
from wire.assembly.base import Answer, StreamAssembler
from wire.assembly.chat import ChatStreamAssembler, message_of, read_chat, reasoning_of, usage_of
from wire.assembly.responses import ResponsesStreamAssembler, read_responses

__all__ = [
    "READERS",
    "Answer",
    "ChatStreamAssembler",
    "MessagesStreamAssembler",
    "ResponsesStreamAssembler",
    "StreamAssembler",
    "message_of",
    "read_answer",
    "read_chat",
    "read_messages",
    "read_responses",
    "reasoning_of",
    "usage_of",
]

# endpoint column value -> reader of that endpoint's answer objects
READERS: dict[str, Callable[[Any], Answer]] = {
    "chat.completions": read_chat,
    "responses": read_responses,
    "messages": read_messages,
}


def read_answer(endpoint: str | None, response: Any) -> Answer:
    """The :class:`Answer` of a recorded ``response`` of ``endpoint`` (``chat.completions`` |
    ``responses`` | ``messages``; an unknown or missing endpoint is read as chat)."""
    return READERS.get(endpoint or "", read_chat)(response)
