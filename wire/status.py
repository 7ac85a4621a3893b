"""The status of a recorded model call (``session_steps.status``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["StepStatus"]


class StepStatus(StrEnum):
    """The ``session_steps.status`` of a recorded model call (what each means, by cause:
    docs/gateway-semantics.md)."""

    OK = "ok"
    ERROR = "error"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    CLIENT_DISCONNECTED = "client_disconnected"
    EMPTY = "empty"
