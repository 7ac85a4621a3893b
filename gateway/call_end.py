"""How one call ended: the phase a failure happened in, one upstream attempt, and the
:class:`CallEnd` that :meth:`gateway.call.Call.finish` turns into a step row, a metric and a
settled retry claim."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from gateway.idempotency import Replay
from wire.status import StepStatus

__all__ = ["Attempt", "CallEnd", "Phase"]


class Phase(StrEnum):
    """``meta_json.phase``: where a call that got no full answer stopped."""

    CONNECT = "connect"  # connecting to the upstream
    FIRST_BYTE = "first-byte"  # waiting for the upstream's headers (or a stream's first byte)
    IDLE = "idle"  # between two bytes of a stream
    BODY = "body"  # reading a non-streamed body
    BACKOFF = "backoff"  # waiting before a retry of the upstream call
    DETACHED = "detached"  # answered after its client left, and no retry came for it


@dataclass(slots=True)
class Attempt:
    """One upstream attempt of a call: the HTTP ``status`` it got (None: no answer), the
    ``Retry-After`` it asked for in seconds, the ``error`` text of a failed attempt, and the
    ``wait_s`` before the next attempt (None: not retried)."""

    status: int | None
    retry_after_s: float | None = None
    error: str | None = None
    wait_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class CallEnd:
    """How one call ended. ``status``: the step's status (None: no step row, a synthetic stop);
    ``status_code``: the step's HTTP status column; ``response``: the recorded response;
    ``meta``: extra ``meta_json`` keys; ``answered``: the HTTP status the client got (counted in
    ``/metrics``; 499 when it left); ``refund``: the call never reached the model, its budget
    unit is given back; ``replay``: what the client got, kept for its retries (an ``ok`` step
    only); ``wait``: wait for the commit in strict mode (False once the client is gone)."""

    status: StepStatus | None
    status_code: int | None
    response: Any
    answered: int
    meta: dict[str, Any] = field(default_factory=dict)
    refund: bool = False
    replay: Replay | None = None
    wait: bool = True
