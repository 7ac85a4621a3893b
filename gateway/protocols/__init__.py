"""The protocol adapters of the three APIs the gateway serves; the forwarding and recording
core is :mod:`gateway.forward`, shared by all three.

* :data:`CHAT`: OpenAI chat completions (``.../chat/completions``, endpoint ``chat.completions``);
* :data:`RESPONSES`: OpenAI Responses (``.../responses``, endpoint ``responses``);
* :data:`MESSAGES`: Anthropic Messages (``.../v1/messages``, endpoint ``messages``).
"""

from __future__ import annotations

from gateway.protocols.anthropic import AnthropicProtocol
from gateway.protocols.base import WireProtocol
from gateway.protocols.chat import ChatProtocol
from gateway.protocols.responses import ResponsesProtocol

__all__ = [
    "CHAT",
    "MESSAGES",
    "RESPONSES",
    "AnthropicProtocol",
    "ChatProtocol",
    "ResponsesProtocol",
    "WireProtocol",
]

CHAT = ChatProtocol()
RESPONSES = ResponsesProtocol()
MESSAGES = AnthropicProtocol()
