"""The one forwarding and recording core behind every model-call endpoint: chat completions,
Responses and Anthropic Messages differ only in their protocol adapter
(:mod:`gateway.protocols`); this module calls the route's upstream, streams back, and records
the call as one step. The upstream half of a call (attempts, retries, timeouts) is
:mod:`gateway.exchange`; answering an SDK's retry of a call is :mod:`gateway.replay`.

Fidelity rules: the client's JSON body is forwarded as received (re-encoded only when the gateway
must change it: ``upstream_model``, chat's ``stream_options.include_usage`` to meter a stream,
or dropping ``stream`` for a route that cannot stream); upstream SSE events are relayed byte for
byte as they are parsed (:mod:`gateway.relay`); the recorded response of a stream is the
assembled answer. In strict telemetry mode a step is committed before the client receives the
end of its answer (the stream's terminal event, or the non-streamed response).

Step ``status`` values written here: ``ok``; ``error`` (upstream 4xx/5xx, an error inside a 200
stream, a failed Responses answer, an unreachable upstream); ``truncated`` (the upstream stream
ended before its terminal event); ``timeout`` (``meta_json.phase``: ``connect``, ``first-byte``,
``idle`` or ``body``); ``client_disconnected`` (the client left: mid-stream, with the partial
answer and the usage known so far; or before any answer, while the gateway waited for the
upstream, with ``meta_json.phase`` ``first-byte`` or ``body`` and an error body saying so);
``empty`` (a stream that ended properly but carried no event at all, e.g. only ``[DONE]``,
faults F8c). A 2xx non-streamed answer that is not a valid answer of the protocol (an HTML page,
broken JSON) is an ``error`` step with the raw body kept, answered 502
``upstream_invalid_response``; an upstream 4xx/5xx (an HTML 502 page too, F19) is relayed with
its status, body and ``Retry-After`` and recorded as an ``error`` step.

Retries (route ``retry``, :class:`gateway.settings.RetrySettings`, faults F9/F10): while nothing
has been sent to the client, an upstream answer whose status is in ``retry_on_status`` (its body
read and dropped) or a connect failure is retried on the same route, after a backoff or the
upstream's ``Retry-After`` (capped), up to ``max_attempts`` in all; a 200 stream is never retried
once it started (a stream that breaks midway is ``truncated`` with exactly what was relayed). The
call stays one step (one unit of budget), recorded from the last attempt, with every attempt in
``meta_json.attempts`` when there was a retry; each retry is counted in ``/metrics``
(``gateway_upstream_retries_total`` by route and reason). Once the attempts are used up the last
upstream answer is relayed as it came (a 429/503 with its body and ``Retry-After``).

A client that leaves while the gateway waits for the upstream (no byte sent to it yet) is
noticed at once (:mod:`gateway.disconnect`): the upstream request is cancelled (its connection
closed, so the upstream sees the close), the route's concurrency slot is freed, and the step is
recorded as ``client_disconnected`` (``meta_json.phase`` ``backoff`` when it left during the wait
before a retry, which ends at once); it still counts against the session's budget. Except
for a non-streamed session call whose client can retry it (an SDK read timeout): that call goes
on so the SDK's retry can join it (:func:`_detach`, ``retry_join_window_s``).

Streaming to a client from a route with ``supports_stream: false`` (or from an upstream that
answers a streaming request with plain JSON): the gateway asks without streaming and sends the
finished answer to the client as a short stream in the protocol's format
(:meth:`WireProtocol.to_stream`); the step is recorded with ``meta_json.stream_synthesized = true``.

Once a session's budget is used, the gateway answers without calling upstream with the
protocol's synthetic stop answer (:meth:`WireProtocol.stop_answer`, HTTP 200, header
``x-gateway-stop-reason: max_steps``), streamed when the client asked to stream.

Budget refunds: a call whose final outcome (after the route's retries) shows it never reached
the model, a connect failure (connect error or connect timeout) or an upstream HTTP 429 or 503
(:data:`NOT_PROCESSED_STATUS`), is
still recorded as its own step (``error``/``timeout``, its own ``seq``) but with
``meta_json.budget_refunded = true`` and ``is_trainable = false``, and its unit of budget is
given back (:meth:`gateway.sessions.SessionManager.refund`).

Retries of a session's call (:mod:`gateway.idempotency`: the same ``Idempotency-Key``, or
``x-stainless-retry-count`` > 0 with a byte-identical body): while the first call is in flight
the retry waits for it (a join), once it is done with an ``ok`` step the retry gets exactly what
its client was answered (a stream: every SSE byte, all at once), with the header
``x-gateway-replayed: true``, counted in ``gateway_idempotent_replays_total`` by endpoint; no
upstream call, no budget, no step. A retry of a call that failed (or whose answer was over the
per-call cap, or was forgotten) is a new call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.call import Call, record
from gateway.disconnect import ClientGone, unless_client_leaves
from gateway.errors import GatewayError, error_body, set_error_shape
from gateway.exchange import Exchange, UpstreamFailed, before_model
from gateway.idempotency import PendingCall, Replay, may_retry
from gateway.protocols import WireProtocol
from gateway.relay import StreamRelay
from gateway.replay import kept_stream, replay_or_claim, settle_after
from gateway.sessions import SessionClosed, StepSlot
from gateway.state import GatewayState
from gateway.streaming import SSE_HEADERS, GuardedStreamingResponse
from gateway.upstream import route_base_url
from gateway.wire import WireRequest, check_session_id, parse_json_body, read_body

log = logging.getLogger(__name__)

STOP_HEADER = {"x-gateway-stop-reason": "max_steps"}
# Upstream statuses that say the request was not taken: 429 Too Many Requests (RFC 6585 section 4)
# and 503 Service Unavailable ("currently unable to handle the request", RFC 9110 section 15.6.4).
# A call whose final answer is one of these uses no budget (see "Budget refunds" above).
NOT_PROCESSED_STATUS = frozenset({429, 503})
_RELAYED_HEADERS = ("retry-after", "x-request-id", "openai-processing-ms", "request-id", "x-should-retry")


async def handle(gw: GatewayState, request: Request, session_id: str | None, proto: WireProtocol) -> Response:
    """Serve one model call of protocol ``proto``; ``session_id`` None means passthrough (not
    recorded).

    Errors the gateway answers itself, in the protocol's error shape: 400 malformed body or a
    standard field of the wrong type (``param`` names it, see :mod:`gateway.wire`), 400 a route
    of another ``api`` (``route_api_mismatch``), 404 unknown route, 409 closed (or closing)
    session, 413 body over ``max_request_bytes``, 502 upstream unreachable, broken, or answering
    2xx with something that is not an answer (``upstream_invalid_response``), 504 upstream
    timeout; upstream 4xx/5xx are relayed with their status, body and Retry-After.

    A retry of an earlier call of the session is answered with that call's answer, or waits for
    it while it is in flight (see the module docstring); every other session call is remembered
    for its own retries (:class:`gateway.idempotency.RecentCalls`) until it is settled.
    """
    set_error_shape(request, proto.client_error)
    if session_id is not None:
        check_session_id(session_id)
    raw = await read_body(request, gw.settings.max_request_bytes)
    body = parse_json_body(raw)
    req = proto.validate(body)
    route_key = req.model
    route = gw.settings.llm_routes.get(route_key)
    if route is None:
        known = ", ".join(sorted(gw.settings.llm_routes)) or "none"
        raise GatewayError(404, f"The model `{route_key}` does not exist (no such route; routes: {known})",
                           code="model_not_found", param="model")
    if route.api != proto.api:
        raise GatewayError(400, f"route `{route_key}` speaks the {route.api} API, which does not serve "
                                f"{proto.endpoint} calls", code="route_api_mismatch", param="model")
    route_base_url(route_key, route, session_id)  # a per-session route without a usable session: 400, no budget

    claim: PendingCall | None = None
    if session_id is not None:
        seen = await replay_or_claim(gw, request, session_id, proto, req, raw)
        if not isinstance(seen, PendingCall):
            return seen
        claim = seen

    response: Response | None = None
    try:
        slot: StepSlot | None = None
        if session_id is not None:
            try:
                slot = await gw.sessions.reserve(session_id, route_key)
            except SessionClosed:
                raise GatewayError(409, f"session {session_id} is closed", code="session_closed") from None
            if slot is None:
                await gw.writer.record(None, gw.sessions.current(session_id))  # the session is now truncated
                return _synthetic_stop(gw, proto, req)

        try:
            response = await _forward(gw, proto, request, raw, body, req, slot, claim)
        except BaseException:
            if slot is not None:
                gw.sessions.release(slot)  # no step row (a bug, a server shutdown): not in flight anymore
            raise
        if slot is not None and not isinstance(response, GuardedStreamingResponse | Detached):
            gw.sessions.release(slot)  # normally released when its step was queued: then a no-op
        return response
    finally:
        # a relayed stream settles its claim when it ends; anything else not done by now failed
        if claim is not None and not isinstance(response, GuardedStreamingResponse | Detached):
            claim.fail()


def _synthetic_stop(gw: GatewayState, proto: WireProtocol, req: WireRequest) -> Response:
    """The protocol's stop answer for a session whose budget is used (no upstream call, no step)."""
    gw.metrics.synthetic_stops.inc()
    gw.metrics.requests.labels(proto.endpoint, req.model, "200").inc()
    answer = proto.stop_answer(req.model, req)
    if req.stream:
        return StreamingResponse(_iter(proto.to_stream(answer, req)), media_type="text/event-stream",
                                 headers=STOP_HEADER)
    return JSONResponse(answer, headers=STOP_HEADER)


async def _forward(gw: GatewayState, proto: WireProtocol, request: Request, raw: bytes, body: dict[str, Any],
                   req: WireRequest, slot: StepSlot | None, claim: PendingCall | None = None) -> Response:
    """Call the route's upstream for a validated request (a step reserved in ``slot``, None for
    passthrough) and answer the client; every path records the step (see the module docstring).
    A successful answer settles ``claim`` (the call as remembered for its retries) with what the
    client is answered; a relayed stream settles it when it ends, whatever the outcome."""
    route = gw.settings.llm_routes[req.model]
    upstream_body, usage_added = proto.upstream_body(req, body, route)
    upstream_streams = bool(req.stream) and route.supports_stream
    payload = raw if upstream_body is body else json.dumps(upstream_body).encode()
    headers = {"Content-Type": "application/json",
               "Accept": "text/event-stream" if upstream_streams else "application/json"}
    headers.update(proto.upstream_headers(route, request.headers))
    headers.update(route.extra_headers)
    if slot is not None:
        headers["X-Session-Id"] = slot.session_id

    call = Call(gw, proto, req, req.model, body, upstream_body, slot, usage_added)
    exchange = Exchange(call, payload, headers, relay_sse=upstream_streams)
    join_window = gw.settings.retry_join_window_s
    run = asyncio.ensure_future(exchange.run())
    detachable = claim is not None and not call.stream and join_window > 0 and may_retry(request.headers)
    try:
        content = await unless_client_leaves(request.receive, asyncio.shield(run) if detachable else run)
    except ClientGone:
        if detachable and not exchange.backing_off:
            assert claim is not None
            return _detach(call, exchange, run, claim, join_window)
        run.cancel()
        await asyncio.wait({run})
        await exchange.close(abort=True)
        return _client_left(call, backing_off=exchange.backing_off)
    except UpstreamFailed as f:
        await exchange.close(abort=True)
        return await _fail(call, f.status, f.step_status, f.error, f.phase, refund=before_model(f))
    except BaseException:
        run.cancel()
        await exchange.close(abort=True)
        raise
    resp = exchange.resp
    assert resp is not None
    if content is None:  # a 200 SSE stream: the relay owns the connection from here
        relay = StreamRelay(call, resp, exchange.stack)
        events: AsyncIterator[bytes] = relay.events()
        finalize: Callable[[], Awaitable[None]] = relay.finish
        if claim is not None:
            events, finalize = kept_stream(events, relay, claim), settle_after(finalize, claim)
        return GuardedStreamingResponse(events, on_disconnect=relay.client_left, finalize=finalize,
                                        media_type="text/event-stream", headers=SSE_HEADERS)
    await exchange.close(abort=False)
    if call.stream and resp.status == 200:
        answer = _answer(proto, content)
        if answer is not None:
            return await _relay_synthesized(call, resp.headers, answer, claim)
    return await _relay_plain(call, resp.status, resp.headers, content, claim)


class Detached(JSONResponse):
    """The 499 of a client that left a call which goes on for its retry (:func:`_detach`): its
    step and its place in the recent calls are settled by the background task, not by
    :func:`handle`."""


def _detach(call: Call, exchange: Exchange, run: asyncio.Future[bytes | None], claim: PendingCall,
            window_s: float) -> Response:
    """The client left a non-streamed call it can retry (an SDK read timeout, typically): let
    the upstream call finish in a background task instead of cancelling it, so that the SDK's
    retry (same body, ``x-stainless-retry-count`` > 0, or the same ``Idempotency-Key``) joins it
    and gets its answer: one model call, one step. When the answer is an ``ok`` answer, the
    task waits up to ``window_s`` seconds (``retry_join_window_s``) for a retry to want it (or
    until the session starts closing): with one, the step is recorded ``ok`` (committed first in
    strict mode) and the retry is answered from it; without, the step is recorded
    ``client_disconnected`` with the answer kept (``meta_json.phase`` ``detached``) and a later
    retry is a new call. Any other outcome is recorded as it would have been. The step carries
    ``meta_json.client_left_after_s``; the call stays in flight for its session until then. A
    session that starts closing (or a gateway that stops) meanwhile can take no retry: the
    upstream call is then cancelled (recorded ``client_disconnected`` as any call whose client
    left) or the wait ends."""
    call.client_left_after_s = time.perf_counter() - call.t0
    claim.client_left = True
    m = call.gw.metrics
    m.requests.labels(call.proto.endpoint, call.route_key, "499").inc()
    task = asyncio.create_task(_finish_detached(call, exchange, run, claim, window_s))
    call.gw.detached.add(task)  # a strong reference, and what a shutdown waits for
    task.add_done_callback(call.gw.detached.discard)
    err = error_body(499, "the client closed the connection before the answer; the call goes on for its retry",
                     code="client_disconnected", type_="client_disconnected")
    return Detached(call.proto.client_error(499, err), status_code=499)  # nobody reads it


async def _finish_detached(call: Call, exchange: Exchange, run: asyncio.Future[bytes | None], claim: PendingCall,
                           window_s: float) -> None:
    """The background half of :func:`_detach`."""
    sid = claim.session_id

    def closing() -> bool:  # no retry can come: the session takes no call, or the gateway stops
        return call.gw.stopping or not call.gw.sessions.takes_calls(sid)

    try:
        while not run.done():  # a session that starts closing takes no retry: stop waiting
            if closing():
                run.cancel()
                await asyncio.wait({run})
                await exchange.close(abort=True)
                _client_left(call)
                return
            await asyncio.wait({run}, timeout=0.05)
        try:
            content = run.result()
        except UpstreamFailed as f:
            await exchange.close(abort=True)
            await _fail(call, f.status, f.step_status, f.error, f.phase, refund=before_model(f))
            return
        resp = exchange.resp
        assert resp is not None and content is not None
        await exchange.close(abort=False)
        if 200 <= resp.status < 300:
            if not await claim.wanted(window_s, closing):
                answer = _answer(call.proto, content)
                call.submit(call.step(status="client_disconnected", status_code=resp.status,
                                      response=answer if answer is not None else
                                      {"raw_body": content[:65536].decode("utf-8", "replace")},
                                      meta={"phase": "detached"}))
                return
        await _relay_plain(call, resp.status, resp.headers, content, claim)
    except Exception:
        log.exception("the detached call of session %s failed", sid)
    finally:
        claim.fail()  # a no-op once done
        call.release()


def _step(call: Call, *, refund: bool, status: str, status_code: int | None, response: Any,
          meta: dict[str, Any]) -> dict[str, Any] | None:
    """``call.step(...)``; when ``refund`` (the call never reached the model) the step's unit of
    budget is given back first, and the step gets ``meta_json.budget_refunded = true`` and
    ``is_trainable = false`` (only when the refund happened: not for a session already closed
    and forgotten)."""
    refunded = refund and call.slot is not None and call.gw.sessions.refund(call.slot)
    if refunded:
        meta = {**meta, "budget_refunded": True}
    step = call.step(status=status, status_code=status_code, response=response, meta=meta)
    if refunded and step is not None:
        step["is_trainable"] = False
    return step


def _client_left(call: Call, *, backing_off: bool = False) -> Response:
    """Record a call whose client left before any answer (the upstream request was cancelled, or
    the wait before a retry: ``meta_json.phase`` ``backoff``). Left during the wait before a
    retry whose last attempt never reached the model (a connect failure, an upstream 429/503),
    the call uses no budget (see :func:`_step`)."""
    refund = False
    if backing_off:
        phase = "backoff"
        last = call.attempts[-1]["status"] if call.attempts else None
        refund = last is None or last in NOT_PROCESSED_STATUS
    else:
        phase = "first-byte" if call.upstream_status is None else "body"
    err = error_body(499, f"the client closed the connection after {time.perf_counter() - call.t0:.3f} s, "
                          f"before the upstream {call.route_key} answered; the upstream request was cancelled",
                     code="client_disconnected", type_="client_disconnected")
    body = call.proto.client_error(499, err)
    call.submit(_step(call, refund=refund, status="client_disconnected", status_code=call.upstream_status,
                      response=body, meta={"phase": phase}))
    call.observe(499)
    return JSONResponse(body, status_code=499)  # nobody reads it: the server drops it


async def _fail(call: Call, status: int, step_status: str, err: dict[str, Any], phase: str, *,
                refund: bool = False) -> JSONResponse:
    """Record a call that got no usable answer and answer the client ``status`` with ``err`` (in
    the protocol's error shape); ``refund``: the call never reached the model (see :func:`_step`)."""
    body = call.proto.client_error(status, err)
    await record(call, _step(call, refund=refund, status=step_status, status_code=status, response=body,
                             meta={"phase": phase, "error": err["error"]}))
    call.observe(status)
    return JSONResponse(body, status_code=status)


async def _iter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def _answer(proto: WireProtocol, content: bytes) -> dict[str, Any] | None:
    """``content`` parsed as a valid answer of ``proto`` (:meth:`WireProtocol.is_answer`), or None."""
    try:
        parsed = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None
    return parsed if proto.is_answer(parsed) else None


async def _relay_synthesized(call: Call, up_headers: Any, answer: dict[str, Any],
                             claim: PendingCall | None = None) -> Response:
    """Answer a streaming client from a finished answer (route without streaming, or an upstream
    that answered JSON): record it (strict: committed first), then stream it. An ``ok`` answer
    settles ``claim`` with the stream's bytes."""
    step_status = call.proto.answer_status(answer)
    await record(call, call.step(status=step_status, status_code=200, response=answer,
                                 meta={"stream_synthesized": True}))
    call.observe(200)
    headers = {**SSE_HEADERS, **{k: v for k in _RELAYED_HEADERS if (v := up_headers.get(k)) is not None}}
    chunks = call.proto.to_stream(answer, call.req)
    if claim is not None and step_status == "ok":
        claim.done(Replay(200, headers, b"".join(chunks), "text/event-stream"))
    return StreamingResponse(_iter(chunks), media_type="text/event-stream", headers=headers)


async def _relay_plain(call: Call, status: int, up_headers: Any, content: bytes,
                       claim: PendingCall | None = None) -> Response:
    """Relay a non-streamed upstream answer with its status and body: an answer (2xx) or an error
    (4xx/5xx, whatever its body, an HTML 502 page too). A 2xx body that is not a valid answer of
    the protocol (HTML, broken JSON, an error object) is not relayed: the client gets 502
    ``upstream_invalid_response`` (its SDK would fail on it), and the step keeps the raw body
    (``status`` ``error``, ``meta_json.upstream_status``). An upstream 429 or 503 never reached
    the model: its unit of budget is refunded (:func:`_step`). An ``ok`` answer settles ``claim``
    with the relayed status, headers and body."""
    try:
        parsed: Any = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if parsed is None:
        recorded: Any = {"raw_body": content[:65536].decode("utf-8", "replace"),
                         "content_type": up_headers.get("Content-Type")}
    else:
        recorded = parsed
    ok = 200 <= status < 300
    if ok and not call.proto.is_answer(parsed):
        return await _invalid_answer(call, status, up_headers, content, recorded)
    step_status = call.proto.answer_status(parsed) if ok else "error"
    meta = {} if step_status == "ok" else {"error": _error_text(parsed, content)}
    await record(call, _step(call, refund=status in NOT_PROCESSED_STATUS, status=step_status, status_code=status,
                             response=recorded, meta=meta))
    headers = {k: v for k in _RELAYED_HEADERS if (v := up_headers.get(k)) is not None}
    call.observe(status)
    media = up_headers.get("Content-Type", "application/json")
    if claim is not None and step_status == "ok":
        claim.done(Replay(status, headers, content, media))
    return Response(content=content, status_code=status, headers=headers, media_type=media)


async def _invalid_answer(call: Call, status: int, up_headers: Any, content: bytes, recorded: Any) -> Response:
    """Answer 502 for a 2xx upstream body that is not an answer; record it as an error."""
    ctype = up_headers.get("Content-Type") or "no content type"
    head = content[:200].decode("utf-8", "replace")
    err = error_body(502, f"upstream {call.route_key} answered HTTP {status} with a body that is not a JSON "
                          f"{call.proto.answer_name} ({ctype}, {len(content)} bytes): {head!r}",
                     code="upstream_invalid_response")
    await record(call, call.step(status="error", status_code=502, response=recorded,
                                 meta={"error": err["error"], "upstream_status": status}))
    call.observe(502)
    return JSONResponse(call.proto.client_error(502, err), status_code=502)


def _error_text(parsed: Any, content: bytes) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message"))
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return content[:500].decode("utf-8", "replace")
