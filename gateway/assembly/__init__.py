"""Stream assembly and answer reading for the three protocols the gateway speaks.

* :mod:`gateway.assembly.chat`: OpenAI chat completions (``chat.completion.chunk`` streams);
* :mod:`gateway.assembly.responses`: OpenAI Responses (``response.*`` event streams);
* :mod:`gateway.assembly.anthropic`: Anthropic Messages (``message_start`` ... ``message_stop``).

Each gives a stream assembler (:class:`gateway.assembly.base.StreamAssembler`) and a reader of
the finished answer object into an :class:`Answer`. :func:`read_answer` picks the reader by the
step's ``endpoint`` column; it is what the promoted step columns and the launcher's trajectory
builder use, so both read an answer the same way. Pure data code (no HTTP).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.assembly.anthropic import MessagesStreamAssembler, read_messages
from gateway.assembly.base import Answer, StreamAssembler
from gateway.assembly.chat import ChatStreamAssembler, message_of, read_chat, reasoning_of, usage_of
from gateway.assembly.responses import ResponsesStreamAssembler, read_responses

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
