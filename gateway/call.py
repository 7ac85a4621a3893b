"""One model call in flight, whatever its protocol: what is needed to build its step row, and the
one place that queues the row for the telemetry writer and ends the call's in-flight mark.

Every reserved step is in flight for its session (:class:`gateway.sessions.SessionManager`)
until its row is queued: :meth:`Call.queue` queues and releases; the paths that end with no row
(a bug, a server shutdown) release in :func:`gateway.forward.handle` or, for a relayed stream, in
:meth:`gateway.relay.StreamRelay.finish`. A step recorded after its session was closed (its
close gave up waiting) carries ``meta_json.after_close = true`` and ``is_trainable = false``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.errors import GatewayError, error_body
from gateway.protocols import WireProtocol
from gateway.redact import redact_request
from gateway.sessions import StepSlot
from gateway.state import GatewayState
from gateway.wire import WireRequest
from store import step_record

log = logging.getLogger(__name__)


class Call:
    """One call: its protocol adapter, the validated request, the client's body and the body sent
    upstream, the reserved step (None for a sessionless passthrough call), and timings (``t0``,
    ``ttft_ms``: milliseconds to the first upstream byte of a stream)."""

    def __init__(self, gw: GatewayState, proto: WireProtocol, req: WireRequest, route_key: str,
                 body: dict[str, Any], upstream_body: dict[str, Any], slot: StepSlot | None,
                 usage_added: bool) -> None:
        self.gw = gw
        self.proto = proto
        self.req = req
        self.route_key = route_key
        self.body = body
        self.upstream_body = upstream_body
        self.slot = slot
        self.stream = bool(req.stream)
        self.usage_added = usage_added
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None
        self.upstream_status: int | None = None  # set once the upstream's headers arrived
        # every upstream attempt (gateway.exchange.Exchange.run): status, retry_after_s, error, wait_s
        self.attempts: list[dict[str, Any]] = []
        # seconds after which the client left a call that went on for its retry (gateway.forward)
        self.client_left_after_s: float | None = None

    def step(self, *, status: str, status_code: int | None, response: Any, meta: dict[str, Any] | None = None
             ) -> dict[str, Any] | None:
        """Build the step row (a dict of every ``session_steps`` column, :func:`store.step_record`;
        None for sessionless calls) and write the request log line. The promoted columns (finish
        reason, token counts) come from the protocol's reading of ``response``
        (:meth:`WireProtocol.read`)."""
        latency_ms = (time.perf_counter() - self.t0) * 1000
        endpoint = self.proto.endpoint
        if self.gw.request_log is not None:
            self.gw.request_log.write(
                session_id=self.slot.session_id if self.slot else None, route=self.route_key, endpoint=endpoint,
                http_status=status_code or 0, step_status=status, latency_ms=latency_ms,
                request=self.upstream_body, response=response)
        if self.slot is None:
            return None
        answer = self.proto.read(response)
        meta_json: dict[str, Any] = {"route": self.route_key}
        if self.upstream_body.get("model") != self.body.get("model"):
            meta_json["upstream_model"] = self.upstream_body.get("model")
        if self.usage_added:
            meta_json["usage_requested_by_gateway"] = True
        if self.client_left_after_s is not None:
            meta_json["client_left_after_s"] = round(self.client_left_after_s, 3)
        if any(a["wait_s"] is not None for a in self.attempts):  # retried (or waiting to): list them
            meta_json["attempts"] = self.attempts
        meta_json.update(meta or {})
        s = self.slot
        after_close = self.gw.sessions.is_after_close(s)
        if after_close:
            meta_json["after_close"] = True
        return step_record(
            session_id=s.session_id, seq=s.seq, step_id=s.step_id, env_name=s.env_name, group_id=s.group_id,
            job_id=s.job_id, llm_model=self.route_key, endpoint=endpoint, is_stream=self.stream, status=status,
            status_code=status_code, messages=self.proto.conversation(self.body),
            request=redact_request(self.upstream_body), response=response, finish_reason=answer.finish_reason,
            prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
            total_tokens=answer.total_tokens, latency_ms=latency_ms, ttft_ms=self.ttft_ms,
            is_truncated=status == "truncated", meta_json=meta_json, is_trainable=not after_close,
        )

    def release(self) -> None:
        """End this call's in-flight mark in its session (idempotent; no-op without a session)."""
        if self.slot is not None:
            self.gw.sessions.release(self.slot)

    def queue(self, step: dict[str, Any] | None) -> asyncio.Future[None] | None:
        """Queue ``step`` for the telemetry writer with the session's live state (copied when the
        batch is committed, so never older than now; see :meth:`SessionManager.live`) and, on
        every outcome, end the call's in-flight mark: the one place where a recorded call stops
        being in flight. The writer commits in queue order, so a session
        close queued after this is committed after the step. Returns the commit future (strict
        mode) or None; raises RuntimeError when the strict queue is full."""
        try:
            if step is None:
                return None
            return self.gw.writer.submit(step, self.gw.sessions.live(step["session_id"]))
        finally:
            self.release()

    def submit(self, step: dict[str, Any] | None) -> None:
        """Queue a step without waiting (for a client that is gone); failures are logged."""
        try:
            fut = self.queue(step)
        except RuntimeError as e:
            log.error("step of session %s not recorded: %s", self.slot.session_id if self.slot else None, e)
            return
        if fut is not None:
            fut.add_done_callback(_log_commit_failure)

    def observe(self, http_status: int) -> None:
        """Count the answer in ``/metrics`` (requests by endpoint/route/status, latency); not for
        a call whose client left (its 499 was counted then)."""
        if self.client_left_after_s is not None:
            return
        m = self.gw.metrics
        m.requests.labels(self.proto.endpoint, self.route_key, str(http_status)).inc()
        m.latency.labels(self.proto.endpoint, self.route_key).observe(time.perf_counter() - self.t0)

    def timeout_error(self, phase: str, e: BaseException) -> dict[str, Any]:
        """The OpenAI-shaped 504 body for an upstream timeout in ``phase``."""
        return error_body(504, f"upstream {self.route_key} timed out ({phase}): {type(e).__name__}: {e}",
                          code="upstream_timeout")


def _log_commit_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.error("a step queued without waiting was not committed: %s: %s", type(e).__name__, e)


async def record(call: Call, step: dict[str, Any] | None) -> None:
    """Commit a step (strict: wait for the commit; ``None``, a passthrough call, is not recorded).
    Raises GatewayError(500) when it fails, having counted the call as a 500 answer in
    ``/metrics``.

    The session state persisted with the step is the session's state when the batch is
    committed (``SessionManager.live``), never the one of when the step was reserved."""
    try:
        fut = call.queue(step)  # also ends the call's in-flight mark, whatever happens
        if fut is not None:
            await asyncio.shield(fut)
    except Exception as e:
        call.observe(500)  # the answer the client gets instead (the error handler sends it)
        raise GatewayError(500, f"the gateway could not record this call: {type(e).__name__}: {e}",
                           code="telemetry_error") from e
