"""The protocol adapter interface: what the forwarding core asks of the API a call speaks; all
else about a call is shared."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from gateway.bodies import validate_body
from gateway.settings import RouteSettings
from wire.assembly import Answer, StreamAssembler
from wire.requests import WireRequest
from wire.sse import format_event
from wire.status import StepStatus
from wire.text import json_text

__all__ = ["WireProtocol", "compact", "inner_error"]


def inner_error(err: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error body (``{}`` when there is none)."""
    inner = err.get("error")
    return inner if isinstance(inner, dict) else {}


def compact(obj: Any) -> str:
    """Compact JSON text (no spaces, UTF-8 kept; all ``\\uXXXX`` escapes when a string holds a
    lone surrogate: :func:`wire.text.json_text`), as the gateway writes its own events."""
    return json_text(obj, separators=(",", ":"))


class WireProtocol(ABC):
    """One API the gateway serves: its ``endpoint`` label, ``upstream_path``, the route ``api`` it
    needs, its ``request_model``, and how messages name an answer and a stream's end."""

    endpoint: ClassVar[str]
    upstream_path: ClassVar[str]
    api: ClassVar[str]
    request_model: ClassVar[type[WireRequest]]
    answer_name: ClassVar[str]
    stream_end: ClassVar[str]

    # ------------------------------------------------------------------ request side
    def validate(self, body: dict[str, Any]) -> WireRequest:
        """The validated body; raises GatewayError(400) naming the field at fault."""
        return validate_body(self.request_model, body)

    def upstream_body(
        self, req: WireRequest, body: dict[str, Any], route: RouteSettings
    ) -> tuple[dict[str, Any], bool]:
        """The body to send upstream (``model`` replaced by ``upstream_model``; stream fields dropped for
        a route that cannot stream; ``body`` itself when unchanged) and whether a usage request was added."""
        out = body
        if route.upstream_model:
            out = {**out, "model": route.upstream_model}
        if req.stream and not route.supports_stream:
            out = {k: v for k, v in out.items() if k not in ("stream", "stream_options")}
        return out, False

    def upstream_headers(self, route: RouteSettings, client_headers: Mapping[str, str]) -> dict[str, str]:
        """Protocol headers for the upstream (credentials included; never recorded). Default
        (OpenAI): ``Authorization: Bearer <route api_key>``."""
        return {"Authorization": f"Bearer {route.api_key}"} if route.api_key else {}

    def conversation(self, body: dict[str, Any]) -> Any:
        """The request conversation for the step's ``messages`` column."""
        return body.get("messages")

    # ------------------------------------------------------------------ answer side
    @abstractmethod
    def assembler(self) -> StreamAssembler:
        """A new assembler for one upstream stream."""

    @abstractmethod
    def is_answer(self, parsed: Any) -> bool:
        """True when a parsed 2xx non-streamed body is a valid answer of this protocol."""

    @abstractmethod
    def read(self, response: Any) -> Answer:
        """The :class:`Answer` of an answer object (or of anything else: then mostly empty)."""

    def answer_status(self, answer: dict[str, Any]) -> StepStatus:
        """The step status of a valid non-streamed answer (``ok``, or ``error`` for an answer
        that reports a failure itself)."""
        return StepStatus.OK

    def hide_event(self, obj: Any) -> bool:
        """For a stream where the gateway added a usage request: True for an event the client
        did not ask for (not relayed, still assembled)."""
        return False

    @abstractmethod
    def to_stream(self, answer: dict[str, Any], req: WireRequest) -> list[bytes]:
        """A finished answer re-told as this protocol's SSE stream (one element per event), for
        a streaming client of a route that cannot stream, and for synthetic stops."""

    @abstractmethod
    def stop_answer(self, model: str, req: WireRequest) -> dict[str, Any]:
        """The synthetic answer that ends the agent's loop once the session's budget is used:
        a valid answer object with empty output and zero usage."""

    # ------------------------------------------------------------------ errors
    def client_error(self, status: int, err: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI-shaped error body (:func:`gateway.errors.error_body`) in this protocol's
        error shape. Default: unchanged."""
        return err

    def stream_error(self, status: int, err: dict[str, Any], asm: StreamAssembler | None) -> bytes:
        """The SSE event that ends a stream with an error the gateway found (truncated stream,
        timeout, recording failure). Default (chat): ``data: {"error": {...}}``."""
        return format_event(compact(self.client_error(status, err)))
