"""One model call in flight and the one owner of its cleanup: :meth:`Call.finish` ends it, whatever the
ending; :meth:`Call.hand_over` passes it to a relayed stream or a detached call;
:meth:`Call.abandon` ends what a call without a row still holds."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from gateway.call_end import Attempt, CallEnd
from gateway.capture import tokens_of
from gateway.errors import GatewayError
from gateway.idempotency import PendingCall, Replay
from gateway.protocols import WireProtocol
from gateway.redact import redact_request
from gateway.sessions import StepSlot
from gateway.state import GatewayState
from store import redact_url, step_record
from store.stepcodec import TokenChain, message_digests, token_chain
from wire.assembly import message_of
from wire.errors import error_body
from wire.requests import WireRequest
from wire.status import StepStatus

log = logging.getLogger(__name__)

STEP_SEQ_HEADER = "x-gateway-step-seq"
STEP_ID_HEADER = "x-gateway-step-id"


class Call:
    """One call: protocol, request, the client's and the upstream body, the reserved step (``slot``),
    the retry claim (``claim``), ``session_id`` and timings."""

    def __init__(
        self,
        gw: GatewayState,
        proto: WireProtocol,
        req: WireRequest,
        body: dict[str, Any],
        claim: PendingCall | None,
        session_id: str | None,
        route_key: str | None = None,
    ) -> None:
        self.gw = gw
        self.proto = proto
        self.req = req
        self.route_key = route_key or req.model  # the route (the request's model may be an alias)
        self.body = body
        self.upstream_body = body
        self.usage_added = False
        self.claim = claim
        self.session_id = session_id
        self.slot: StepSlot | None = None
        self.stream = bool(req.stream)
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None
        self.upstream_status: int | None = None  # set once the upstream's headers arrived
        self.attempts: list[Attempt] = []
        self.client_left_after_s: float | None = None  # set when the call goes on after its client left
        self.client_headers: dict[str, str] = {}  # the client's correlation headers (gateway.client_headers)
        self.session_header: str | None = None  # the header that named the session (no session in the path)
        self.worker: str | None = None  # the pool worker of the last attempt (a route with base_urls)
        self.finished = False
        self.handed_over = False
        self._counted = False
        self.capture_added: frozenset[str] = frozenset()  # request fields token capture added
        self.policy_version: int | None = None  # the version when the call was admitted
        self.admitted = False  # counted in flight by gw.policy until released
        self.tokens: TokenChain | None = None  # fingerprints of the step's token ids, once read
        self.digests: tuple[bytes, ...] | None = None  # exact digest of each message, once per step
        self._recorded = False  # the step row was handed to the telemetry writer

    # ------------------------------------------------------------------ ownership
    def hand_over(self) -> Call:
        """Move the ownership of this call to a stream relay or a detached task: the caller that
        opened it no longer abandons it; the new owner must :meth:`finish` or :meth:`abandon`."""
        self.handed_over = True
        return self

    def abandon(self) -> None:
        """End what the call still holds without a row: the in-flight mark and the retry claim
        (failed). Idempotent; a no-op after :meth:`finish` except for a claim still unsettled."""
        self.finished = True
        self._release()
        if self.claim is not None:
            self.claim.fail()

    async def finish(self, end: CallEnd) -> None:
        """End the call with ``end``: refund, step row and request log line, queue, release, wait for
        the commit (strict mode), metrics, settle the retry claim. Raises GatewayError(500) when the
        step cannot be recorded. A second call is a no-op."""
        if self.finished:
            return
        self.finished = True
        try:
            try:
                refunded = end.refund and self.slot is not None and await self.gw.sessions.refund(self.slot)
                commit = self._queue(end, refunded)
            finally:
                self._release()  # queued (or failed to): no longer in flight
            if commit is not None:
                if end.wait:
                    await asyncio.shield(commit)
                else:
                    commit.add_done_callback(_log_commit_failure)
        except Exception as e:
            if self.claim is not None:
                self.claim.fail()
            if not end.wait:
                log.error("step of session %s not recorded: %s: %s", self.session_id, type(e).__name__, e)
                return
            self.count(500)  # the answer the client gets instead
            raise GatewayError(
                500,
                f"the gateway could not record this call: {type(e).__name__}: {e}",
                code="telemetry_error",
            ) from e
        self.count(end.answered, timed=end.status is not None)  # a synthetic stop is not timed
        if self.claim is not None:
            if end.status == StepStatus.OK and end.replay is not None:
                self.claim.done(self._kept(end.replay))
            elif not (self.stream and end.status == StepStatus.OK):
                self.claim.fail()  # an ok stream's claim is settled by sent() once its bytes are out

    def step_headers(self) -> dict[str, str]:
        """The response headers naming the reserved step: ``x-gateway-step-seq`` and
        ``x-gateway-step-id`` (empty without a step)."""
        s = self.slot
        return {} if s is None else {STEP_SEQ_HEADER: str(s.seq), STEP_ID_HEADER: str(s.step_id)}

    def _kept(self, replay: Replay) -> Replay:
        """``replay`` with the step headers: a retry answered from it names the same step."""
        return replace(replay, headers={**replay.headers, **self.step_headers()})

    def sent(self, replay: Replay | None) -> None:
        """A relayed ``ok`` stream went out completely: keep ``replay`` (every byte sent, None when
        over the per-call cap) for its retries, else forget the call."""
        if self.claim is not None:
            if replay is not None:
                self.claim.done(self._kept(replay))
            else:
                self.claim.fail()

    # ------------------------------------------------------------------ pieces of finish
    def admit_now(self) -> None:
        """Count this call in flight for the policy control (no pause holds it) and take the
        policy version its step is stamped with."""
        self.policy_version = self.gw.policy.admit_now()
        self.admitted = True

    async def admit(self) -> None:
        """:meth:`admit_now` after any pause (``POST /admin/pause``) is over."""
        self.policy_version = await self.gw.policy.admit()
        self.admitted = True

    def _release(self) -> None:
        if self.slot is not None:
            self.gw.sessions.release(self.slot, recorded=self._recorded)
        if self.admitted:
            self.admitted = False
            self.gw.policy.done()

    def _queue(self, end: CallEnd, refunded: bool) -> asyncio.Future[None] | None:
        """Build the row, write the request log line and queue the row for the telemetry
        writer with the session's live state. Returns the commit future (strict) or None."""
        if end.status is None:  # a synthetic stop: no step, the session's state only
            state = self.gw.sessions.live(self.session_id) if self.session_id is not None else None
            return self.gw.writer.enqueue(None, state) if state is not None else None
        step = self._row(end, refunded)
        if step is None:
            return None
        state = self.gw.sessions.live(step["session_id"])
        if not self.gw.settings.telemetry.step_deltas:
            fut = self.gw.writer.enqueue(step, state)
        else:
            encoder = self.gw.encoder
            pending = encoder.encode(
                step, self.tokens, self.digests
            )  # a delta on the session's last committed step
            fut = self.gw.writer.enqueue(step, state, on_commit=lambda: encoder.committed(pending))
        self._recorded = True  # handed to the writer (which reports a record it loses)
        return fut

    def _row(self, end: CallEnd, refunded: bool) -> dict[str, Any] | None:
        """The step row (every ``session_steps`` column; None for a sessionless call) after
        writing the request log line. Promoted columns come from :meth:`WireProtocol.read`."""
        assert end.status is not None
        latency_ms = (time.perf_counter() - self.t0) * 1000
        if self.gw.request_log is not None:
            self.gw.request_log.write(
                session_id=self.session_id,
                route=self.route_key,
                endpoint=self.proto.endpoint,
                http_status=end.status_code or 0,
                step_status=end.status.value,
                latency_ms=latency_ms,
                request=self.upstream_body,
                response=end.response,
            )
        s = self.slot
        if s is None:
            return None
        answer = self.proto.read(end.response)
        meta: dict[str, Any] = {"route": self.route_key}
        if self.req.model != self.route_key:
            meta["requested_model"] = self.req.model
        if self.upstream_body.get("model") != self.body.get("model"):
            meta["upstream_model"] = self.upstream_body.get("model")
        if self.usage_added:
            meta["usage_requested_by_gateway"] = True
        if self.client_headers:
            meta["client_headers"] = self.client_headers
        if self.session_header is not None:
            meta["session_header"] = self.session_header
        if self.worker is not None:
            meta["upstream_worker"] = redact_url(self.worker)
        if self.client_left_after_s is not None:
            meta["client_left_after_s"] = round(self.client_left_after_s, 3)
        if any(a.wait_s is not None for a in self.attempts):  # retried (or waiting to): list them
            meta["attempts"] = [a.as_json() for a in self.attempts]
        meta.update(end.meta)
        if refunded:
            meta["budget_refunded"] = True
        after_close = self.gw.sessions.is_after_close(s)
        if after_close:
            meta["after_close"] = True
        if self.capture_added:
            meta["capture_added"] = sorted(self.capture_added)
        prompt_ids = completion_ids = logprobs = None
        extends = None
        conversation = self.proto.conversation(self.body)
        # once per step, for the prefix check and the encoder (without deltas the check hashes alone)
        self.digests = message_digests(conversation) if self.gw.settings.telemetry.step_deltas else None
        if self.proto.endpoint == "chat.completions":
            prompt_ids, completion_ids, logprobs = tokens_of(end.response)
            ok = end.status == StepStatus.OK
            self.tokens = token_chain(
                prompt_ids, completion_ids
            )  # once, for the prefix check and the encoder
            extends = self.gw.prefixes.observe(
                s.session_id,
                s.seq,
                ok=ok,
                prompt_ids=prompt_ids,
                tokens=self.tokens,
                messages=conversation,
                answer_message=(message_of(end.response) or None) if ok else None,
                tools=self.body.get("tools"),
                digests=self.digests,
            )
        return step_record(
            session_id=s.session_id,
            seq=s.seq,
            step_id=s.step_id,
            env_name=s.env_name,
            group_id=s.group_id,
            job_id=s.job_id,
            llm_model=self.route_key,
            endpoint=self.proto.endpoint,
            is_stream=self.stream,
            status=end.status.value,
            status_code=end.status_code,
            messages=conversation,
            request=redact_request(self.upstream_body),
            response=end.response,
            finish_reason=answer.finish_reason,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            total_tokens=answer.total_tokens,
            latency_ms=latency_ms,
            ttft_ms=self.ttft_ms,
            is_truncated=end.status == StepStatus.TRUNCATED,
            meta_json=meta,
            is_trainable=not (after_close or refunded),
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            completion_logprobs=logprobs,
            policy_version=self.policy_version,
            extends_prefix=extends,
        )

    def count(self, http_status: int, *, timed: bool = True) -> None:
        """Count the answer in ``/metrics`` once (requests by endpoint/route/status; latency
        unless not ``timed``)."""
        if self._counted:
            return
        self._counted = True
        seconds = time.perf_counter() - self.t0 if timed else None
        self.gw.metrics.answer(self.proto.endpoint, self.route_key, http_status, seconds)

    def left(self) -> None:
        """The client left but the call goes on (for its retry): count its 499 now."""
        self.client_left_after_s = time.perf_counter() - self.t0
        self.count(499)

    def timeout_error(self, phase: str, e: BaseException) -> dict[str, Any]:
        """The OpenAI-shaped 504 body for an upstream timeout in ``phase``."""
        return error_body(
            504,
            f"upstream {self.route_key} timed out ({phase}): {type(e).__name__}: {e}",
            code="upstream_timeout",
        )


def _log_commit_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.error("a step queued without waiting was not committed: %s: %s", type(e).__name__, e)
