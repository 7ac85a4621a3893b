"""``POST .../chat/completions``: forward to the route's upstream, stream back, record the step.

Fidelity rules: the client's JSON body is forwarded as received (re-encoded only when the gateway
must change it: ``upstream_model``, adding ``stream_options.include_usage`` to meter a stream, or
dropping ``stream`` for a route that cannot stream); upstream SSE events are relayed byte for byte
as they are parsed (comment and data-less blocks are not relayed, see faults F2); the recorded
response of a stream is the assembled completion. In strict telemetry mode a step is committed
before the client receives ``[DONE]`` (or, without streaming, the response).

Step ``status`` values written here: ``ok``; ``error`` (upstream 4xx/5xx, an error event inside a
200 stream, an unreachable upstream); ``truncated`` (the upstream stream ended without
``[DONE]``/finish_reason); ``timeout`` (``meta_json.phase``: ``connect``, ``first-byte``,
``idle`` or ``body``); ``client_disconnected`` (the client left: mid-stream, with the partial
answer and the usage known so far; or before any answer, while the gateway waited for the
upstream, with ``meta_json.phase`` ``first-byte`` or ``body`` and an error body saying so);
``empty`` (a stream that ended properly but carried no chunk at all, e.g. only ``[DONE]``,
faults F8c). A 2xx non-streamed answer that is not a JSON chat completion (an HTML page, broken
JSON) is an ``error`` step with the raw body kept, answered 502 ``upstream_invalid_response``.

A client that leaves while the gateway waits for the upstream (no byte sent to it yet) is
noticed at once (:mod:`gateway.disconnect`): the upstream request is cancelled (its connection
closed, so the upstream sees the close), the route's concurrency slot is freed, and the step is
recorded as ``client_disconnected``; it still counts against the session's budget.

Every reserved step is in flight for the session (:class:`gateway.sessions.SessionManager`)
until its row is queued for the writer: :meth:`_Call.queue` is the one place that queues and
releases; paths that end with no row (a bug, a server shutdown) release in :func:`handle_chat`
(or, for a relayed stream, in :meth:`_StreamRelay.finish`). A step recorded after its session
was closed (its close gave up waiting) carries ``meta_json.after_close = true`` and
``is_trainable = false``.

Streaming to a client from a route with ``supports_stream: false`` (or from an upstream that
answers a streaming request with plain JSON): the gateway asks without streaming and sends the
finished completion to the client as a short synthesized stream
(:func:`gateway.synthetic.completion_to_stream`); the step is recorded with
``meta_json.stream_synthesized = true``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.assembly import ChatStreamAssembler, usage_of
from gateway.disconnect import ClientGone, unless_client_leaves
from gateway.errors import GatewayError, error_body
from gateway.redact import redact_request
from gateway.sessions import SessionClosed, StepSlot
from gateway.sse import SSEParser, format_event
from gateway.state import GatewayState
from gateway.streaming import GuardedStreamingResponse
from gateway.synthetic import STOP_HEADER, chat_stop_completion, chat_stop_stream, completion_to_stream
from gateway.wire import ChatCompletionRequest, parse_json_body, read_body, validate_chat
from store import SessionStep

log = logging.getLogger(__name__)

ENDPOINT = "chat.completions"
_RELAYED_HEADERS = ("retry-after", "x-request-id", "openai-processing-ms")
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _is_usage_only(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("choices") == [] and obj.get("usage") is not None


class _Call:
    """One chat call in flight: what is needed to build its step row."""

    def __init__(self, gw: GatewayState, route_key: str, body: dict[str, Any], upstream_body: dict[str, Any],
                 slot: StepSlot | None, stream: bool, usage_added: bool) -> None:
        self.gw = gw
        self.route_key = route_key
        self.body = body
        self.upstream_body = upstream_body
        self.slot = slot
        self.stream = stream
        self.usage_added = usage_added
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None
        self.upstream_status: int | None = None  # set once the upstream's headers arrived

    def step(self, *, status: str, status_code: int | None, response: Any, meta: dict[str, Any] | None = None
             ) -> SessionStep | None:
        """Build the step row (None for sessionless calls) and write the request log line."""
        if self.gw.request_log is not None:
            self.gw.request_log.write(
                session_id=self.slot.session_id if self.slot else None, route=self.route_key, endpoint=ENDPOINT,
                http_status=status_code or 0, step_status=status, latency_ms=(time.perf_counter() - self.t0) * 1000,
                request=self.upstream_body, response=response)
        if self.slot is None:
            return None
        usage = usage_of(response) if isinstance(response, dict) else None
        finish = None
        if isinstance(response, dict):
            choices = response.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                finish = choices[0].get("finish_reason")
        meta_json: dict[str, Any] = {"route": self.route_key}
        if self.upstream_body.get("model") != self.body.get("model"):
            meta_json["upstream_model"] = self.upstream_body.get("model")
        if self.usage_added:
            meta_json["usage_requested_by_gateway"] = True
        meta_json.update(meta or {})
        s = self.slot
        after_close = self.gw.sessions.is_after_close(s)
        if after_close:
            meta_json["after_close"] = True
        return SessionStep(
            session_id=s.session_id, seq=s.seq, step_id=s.step_id, env_name=s.env_name, group_id=s.group_id,
            job_id=s.job_id, llm_model=self.route_key, endpoint=ENDPOINT, is_stream=self.stream, status=status,
            status_code=status_code, messages=self.body.get("messages"), request=redact_request(self.upstream_body),
            response=response, finish_reason=finish if isinstance(finish, str) else None,
            prompt_tokens=_int(usage, "prompt_tokens"), completion_tokens=_int(usage, "completion_tokens"),
            total_tokens=_int(usage, "total_tokens"),
            latency_ms=(time.perf_counter() - self.t0) * 1000, ttft_ms=self.ttft_ms,
            is_truncated=status == "truncated", meta_json=meta_json, is_trainable=not after_close,
        )

    def release(self) -> None:
        """End this call's in-flight mark in its session (idempotent; no-op without a session)."""
        if self.slot is not None:
            self.gw.sessions.release(self.slot)

    def queue(self, step: SessionStep | None) -> asyncio.Future[None] | None:
        """Queue ``step`` for the telemetry writer with the session's state as it is now (see
        ``_record``) and, on every outcome, end the call's in-flight mark: the one place where a
        recorded call stops being in flight. The writer commits in queue order, so a session
        close queued after this is committed after the step. Returns the commit future (strict
        mode) or None; raises RuntimeError when the strict queue is full."""
        try:
            if step is None:
                return None
            return self.gw.writer.submit(step, self.gw.sessions.current(step.session_id))
        finally:
            self.release()

    def submit(self, step: SessionStep | None) -> None:
        """Queue a step without waiting (for a client that is gone); failures are logged."""
        try:
            fut = self.queue(step)
        except RuntimeError as e:
            log.error("step of session %s not recorded: %s", self.slot.session_id if self.slot else None, e)
            return
        if fut is not None:
            fut.add_done_callback(_log_commit_failure)

    def observe(self, http_status: int) -> None:
        m = self.gw.metrics
        m.requests.labels(ENDPOINT, self.route_key, str(http_status)).inc()
        m.latency.labels(ENDPOINT, self.route_key).observe(time.perf_counter() - self.t0)


def _log_commit_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.error("a step queued without waiting was not committed: %s: %s", type(e).__name__, e)


def _int(usage: dict[str, Any] | None, key: str) -> int | None:
    v = usage.get(key) if isinstance(usage, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _timeout_error(route_key: str, phase: str, e: BaseException) -> dict[str, Any]:
    return error_body(504, f"upstream {route_key} timed out ({phase}): {type(e).__name__}: {e}",
                      code="upstream_timeout")


async def handle_chat(gw: GatewayState, request: Request, session_id: str | None) -> Response:
    """Serve one chat completion call; ``session_id`` None means passthrough (not recorded).

    Errors the gateway answers itself (OpenAI's shape): 400 malformed body or a standard field of
    the wrong type (``param`` names it, see :mod:`gateway.wire`), 404 unknown route, 409 closed
    (or closing) session, 413 body over ``max_request_bytes``, 502 upstream unreachable, broken,
    or answering 2xx with something that is not a chat completion (``upstream_invalid_response``),
    504 upstream timeout; upstream 4xx/5xx are relayed with their status, body and Retry-After.
    A client that leaves before any answer is recorded as ``client_disconnected`` (see the module
    docstring).
    """
    raw = await read_body(request, gw.settings.max_request_bytes)
    body = parse_json_body(raw)
    req = validate_chat(body)
    route_key = req.model
    route = gw.settings.llm_routes.get(route_key)
    if route is None:
        known = ", ".join(sorted(gw.settings.llm_routes)) or "none"
        raise GatewayError(404, f"The model `{route_key}` does not exist (no such route; routes: {known})",
                           code="model_not_found", param="model")
    stream = bool(req.stream)
    client_usage = bool((req.stream_options or {}).get("include_usage"))

    slot: StepSlot | None = None
    if session_id is not None:
        try:
            slot, snapshot = await gw.sessions.reserve(session_id, route_key)
        except SessionClosed:
            raise GatewayError(409, f"session {session_id} is closed", code="session_closed") from None
        if slot is None:
            gw.metrics.synthetic_stops.inc()
            await gw.writer.record(None, snapshot)
            gw.metrics.requests.labels(ENDPOINT, route_key, "200").inc()
            if stream:
                events = chat_stop_stream(route_key, client_usage)
                return StreamingResponse(_iter(events), media_type="text/event-stream", headers=STOP_HEADER)
            return JSONResponse(chat_stop_completion(route_key), headers=STOP_HEADER)

    try:
        response = await _forward(gw, request, raw, body, req, route_key, slot)
    except BaseException:
        if slot is not None:
            gw.sessions.release(slot)  # no step row (a bug, a server shutdown): not in flight anymore
        raise
    if slot is not None and not isinstance(response, GuardedStreamingResponse):
        gw.sessions.release(slot)  # normally released when its step was queued: then a no-op
    return response


class _UpstreamFailed(Exception):
    """The upstream gave no usable answer: answer the client ``status`` with ``error`` and record
    a step of status ``step_status`` with ``meta_json.phase``."""

    def __init__(self, status: int, step_status: str, error: dict[str, Any], phase: str) -> None:
        super().__init__(error["error"]["message"])
        self.status = status
        self.step_status = step_status
        self.error = error
        self.phase = phase


class _Exchange:
    """The upstream half of one call: POST the payload and wait for the headers, then (unless the
    answer is an SSE stream to relay) read the whole body. :meth:`run` is what the client's
    disconnect cancels; the response stays open on ``stack`` (holding the route's concurrency
    slot) until :meth:`close` or a stream relay takes it over."""

    def __init__(self, call: _Call, payload: bytes, headers: dict[str, str], relay_sse: bool) -> None:
        self.call = call
        self.payload = payload
        self.headers = headers
        self.relay_sse = relay_sse
        self.stack = AsyncExitStack()
        self.resp: aiohttp.ClientResponse | None = None

    async def run(self) -> bytes | None:
        """The whole body, or None when the answer is a 200 SSE stream to relay. Raises
        _UpstreamFailed for connect/read failures and timeouts."""
        call = self.call
        try:
            self.resp = resp = await self.stack.enter_async_context(
                call.gw.upstream.post(call.route_key, "/chat/completions", self.payload, self.headers))
        except TimeoutError as e:  # before aiohttp.ClientError: its timeouts are both
            phase = "connect" if isinstance(e, aiohttp.ConnectionTimeoutError) else "first-byte"
            raise _UpstreamFailed(504, "timeout", _timeout_error(call.route_key, phase, e), phase) from e
        except aiohttp.ClientError as e:
            err = error_body(502, f"upstream {call.route_key} unreachable: {type(e).__name__}: {e}",
                             code="upstream_unreachable")
            raise _UpstreamFailed(502, "error", err, "connect") from e
        call.upstream_status = resp.status
        if self.relay_sse and resp.status == 200 and resp.content_type == "text/event-stream":
            return None
        try:
            return await resp.read()
        except TimeoutError as e:
            raise _UpstreamFailed(504, "timeout", _timeout_error(call.route_key, "body", e), "body") from e
        except aiohttp.ClientError as e:
            err = error_body(502, f"upstream {call.route_key} failed while sending its answer: "
                                  f"{type(e).__name__}: {e}", code="upstream_broken")
            raise _UpstreamFailed(502, "error", err, "body") from e

    async def close(self, *, abort: bool) -> None:
        """Release the upstream connection and the route slot; ``abort`` closes the connection
        (so the upstream sees the client's departure) instead of returning it to the pool."""
        if abort and self.resp is not None:
            self.resp.close()
        await self.stack.aclose()


async def _forward(gw: GatewayState, request: Request, raw: bytes, body: dict[str, Any],
                   req: ChatCompletionRequest, route_key: str, slot: StepSlot | None) -> Response:
    """Call the route's upstream for a validated request (a step reserved in ``slot``, None for
    passthrough) and answer the client; every path records the step (see the module docstring)."""
    route = gw.settings.llm_routes[route_key]
    stream = bool(req.stream)
    client_usage = bool((req.stream_options or {}).get("include_usage"))
    upstream_body = body
    usage_added = False
    upstream_streams = stream and route.supports_stream
    if route.upstream_model:
        upstream_body = {**upstream_body, "model": route.upstream_model}
    if stream and not route.supports_stream:
        upstream_body = {k: v for k, v in upstream_body.items() if k not in ("stream", "stream_options")}
    elif stream and not client_usage:
        upstream_body = {**upstream_body, "stream_options": {**(req.stream_options or {}), "include_usage": True}}
        usage_added = True
    payload = raw if upstream_body is body else json.dumps(upstream_body).encode()

    headers = {"Content-Type": "application/json",
               "Accept": "text/event-stream" if upstream_streams else "application/json"}
    if route.api_key:
        headers["Authorization"] = f"Bearer {route.api_key}"
    headers.update(route.extra_headers)
    if slot is not None:
        headers["X-Session-Id"] = slot.session_id

    call = _Call(gw, route_key, body, upstream_body, slot, stream, usage_added)
    exchange = _Exchange(call, payload, headers, relay_sse=upstream_streams)
    try:
        content = await unless_client_leaves(request.receive, exchange.run())
    except ClientGone:
        await exchange.close(abort=True)
        return _client_left(call)
    except _UpstreamFailed as f:
        await exchange.close(abort=True)
        return await _fail(call, f.status, f.step_status, f.error, f.phase)
    except BaseException:
        await exchange.close(abort=True)
        raise
    resp = exchange.resp
    assert resp is not None
    if content is None:  # a 200 SSE stream: the relay owns the connection from here
        relay = _StreamRelay(call, resp, exchange.stack)
        return GuardedStreamingResponse(relay.events(), on_disconnect=relay.client_left, finalize=relay.finish,
                                        media_type="text/event-stream", headers=_SSE_HEADERS)
    await exchange.close(abort=False)
    if stream and resp.status == 200:
        completion = _completion(content)
        if completion is not None:
            return await _relay_synthesized(call, resp.headers, completion, client_usage)
    return await _relay_plain(call, resp.status, resp.headers, content)


def _client_left(call: _Call) -> Response:
    """Record a call whose client left before any answer (the upstream request was cancelled)."""
    phase = "first-byte" if call.upstream_status is None else "body"
    err = error_body(499, f"the client closed the connection after {time.perf_counter() - call.t0:.3f} s, "
                          f"before the upstream {call.route_key} answered; the upstream request was cancelled",
                     code="client_disconnected", type_="client_disconnected")
    call.submit(call.step(status="client_disconnected", status_code=call.upstream_status, response=err,
                          meta={"phase": phase}))
    call.observe(499)
    return JSONResponse(err, status_code=499)  # nobody reads it: the server drops it


async def _fail(call: _Call, status: int, step_status: str, err: dict[str, Any], phase: str) -> JSONResponse:
    """Record a call that got no usable answer and answer the client ``status`` with ``err``."""
    await _record(call, call.step(status=step_status, status_code=status, response=err, meta={"phase": phase}))
    call.observe(status)
    return JSONResponse(err, status_code=status)


async def _iter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def _record(call: _Call, step: SessionStep | None) -> None:
    """Commit a step (strict: wait for the commit; ``None``, a passthrough call, is not recorded).
    Raises GatewayError(500) when it fails.

    The session state persisted with the step is the session's state at this moment
    (``SessionManager.current``), not the one of when the step was reserved."""
    try:
        fut = call.queue(step)  # also ends the call's in-flight mark, whatever happens
        if fut is not None:
            await asyncio.shield(fut)
    except Exception as e:
        raise GatewayError(500, f"the gateway could not record this call: {type(e).__name__}: {e}",
                           code="telemetry_error") from e


def _completion(content: bytes) -> dict[str, Any] | None:
    """``content`` parsed as a ``chat.completion`` object (a dict with a ``choices`` list and no
    ``error``), or None."""
    try:
        parsed = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("choices"), list) and parsed.get("error") is None:
        return parsed
    return None


async def _relay_synthesized(call: _Call, up_headers: Any, completion: dict[str, Any],
                             client_usage: bool) -> Response:
    """Answer a streaming client from a finished completion (route without streaming, or an
    upstream that answered JSON): record it (strict: committed first), then stream it."""
    await _record(call, call.step(status="ok", status_code=200, response=completion,
                                  meta={"stream_synthesized": True}))
    call.observe(200)
    headers = {**_SSE_HEADERS, **{k: v for k in _RELAYED_HEADERS if (v := up_headers.get(k)) is not None}}
    return StreamingResponse(_iter(completion_to_stream(completion, client_usage)), media_type="text/event-stream",
                             headers=headers)


async def _relay_plain(call: _Call, status: int, up_headers: Any, content: bytes) -> Response:
    """Relay a non-streamed upstream answer with its status and body: a chat completion (2xx)
    or an error (4xx/5xx, whatever its body). A 2xx body that is not a JSON chat completion
    (HTML, broken JSON, an error object) is not relayed: the client gets 502
    ``upstream_invalid_response`` (the openai SDK would fail on it), and the step keeps the
    raw body (``status`` ``error``, ``meta_json.upstream_status``)."""
    try:
        parsed: Any = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if parsed is None:
        recorded: Any = {"raw_body": content[:65536].decode("utf-8", "replace"),
                         "content_type": up_headers.get("Content-Type")}
    else:
        recorded = parsed
    if 200 <= status < 300 and _completion(content) is None:
        return await _invalid_answer(call, status, up_headers, content, recorded)
    ok = 200 <= status < 300
    meta = {} if ok else {"error": _error_text(parsed, content)}
    await _record(call, call.step(status="ok" if ok else "error", status_code=status, response=recorded, meta=meta))
    headers = {k: v for k in _RELAYED_HEADERS if (v := up_headers.get(k)) is not None}
    call.observe(status)
    media = up_headers.get("Content-Type", "application/json")
    return Response(content=content, status_code=status, headers=headers, media_type=media)


async def _invalid_answer(call: _Call, status: int, up_headers: Any, content: bytes, recorded: Any) -> Response:
    """Answer 502 for a 2xx upstream body that is not a chat completion; record it as an error."""
    ctype = up_headers.get("Content-Type") or "no content type"
    head = content[:200].decode("utf-8", "replace")
    err = error_body(502, f"upstream {call.route_key} answered HTTP {status} with a body that is not a JSON chat "
                          f"completion ({ctype}, {len(content)} bytes): {head!r}", code="upstream_invalid_response")
    await _record(call, call.step(status="error", status_code=502, response=recorded,
                                  meta={"error": err["error"], "upstream_status": status}))
    call.observe(502)
    return JSONResponse(err, status_code=502)


def _error_text(parsed: Any, content: bytes) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message"))
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return content[:500].decode("utf-8", "replace")


class _StreamRelay:
    """Relays one upstream SSE stream to the client and records it as one step.

    :meth:`events` is the response body; the :class:`GuardedStreamingResponse` calls
    :meth:`client_left` when the client goes away and always awaits :meth:`finish` at the end.

    End states: ``[DONE]`` (or a finish_reason) → ok (``empty`` without any chunk), committed
    before ``[DONE]`` is relayed; an ``{"error": ...}`` event → error; EOF or a broken
    connection without ``[DONE]`` → truncated, and the client gets an error event instead of a
    fake ``[DONE]``; a read timeout → timeout (phase ``first-byte`` or ``idle``), also ended by
    an error event; an unexpected exception while relaying → error, logged, ended by an error
    event. The client leaving, at any point, even before the body started (task
    cancelled, or body never run) → the upstream connection is closed at once and the partial
    step is recorded as ``client_disconnected`` by :meth:`finish`.
    """

    def __init__(self, call: _Call, resp: aiohttp.ClientResponse, stack: AsyncExitStack) -> None:
        self.call = call
        self.resp = resp
        self.stack = stack
        self.asm = ChatStreamAssembler()
        self.gone = False
        self.recorded = False

    def client_left(self) -> None:
        """The client disconnected: stop reading the upstream at once."""
        self.gone = True
        self.resp.close()

    async def finish(self) -> None:
        """Release the upstream connection and the route slot; when no final step was recorded
        (the client left, the body never ran or was cancelled), record the partial one."""
        call = self.call
        try:
            if not self.recorded:
                self.recorded = True
                self.resp.close()
                call.submit(call.step(status="client_disconnected", status_code=self.resp.status,
                                      response=self.asm.result(), meta={"chunks": self.asm.chunk_count}))
                call.observe(499)
            await self.stack.aclose()
        finally:
            call.release()  # normally done when the step was queued: then a no-op

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE bytes for the client (see the class docstring)."""
        call, asm = self.call, self.asm
        parser = SSEParser()
        done_raw: bytes | None = None
        failure: dict[str, Any] | None = None
        phase: str | None = None
        status = "ok"
        if self.gone:
            return
        try:
            async for data in self.resp.content.iter_any():
                if call.ttft_ms is None:
                    call.ttft_ms = (time.perf_counter() - call.t0) * 1000
                    call.gw.metrics.ttft.labels(call.route_key).observe(call.ttft_ms / 1000)
                for ev in parser.feed(data):
                    if ev.data == "[DONE]":
                        asm.feed_done()
                        done_raw = ev.raw
                        continue
                    try:
                        obj = json.loads(ev.data)
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict):
                        asm.feed_chunk(obj)
                        if call.usage_added and _is_usage_only(obj):
                            continue
                    yield ev.raw
            status = asm.status()
            if status == "truncated":
                failure = error_body(502, "upstream closed the stream before it finished (no [DONE])",
                                     code="upstream_stream_truncated")
        except TimeoutError as e:  # before the connection errors: aiohttp's read timeout is both
            status = "timeout"
            phase = "first-byte" if call.ttft_ms is None else "idle"
            failure = _timeout_error(call.route_key, phase, e)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            if self.gone:
                return  # our own close after the client left; finish() records it
            status = "truncated"
            failure = error_body(502, f"upstream stream broke: {type(e).__name__}: {e}", code="upstream_stream_broken")
        except Exception as e:  # a bug or an unforeseen client error: end the stream loudly, keep the step
            log.exception("relaying the stream of route %s failed", call.route_key)
            status = "error"
            failure = error_body(500, f"the gateway failed while relaying the stream: {type(e).__name__}: {e}",
                                 code="internal_error")
        await self.stack.aclose()  # release the connection and the route slot before recording
        if self.gone:
            return
        if status == "ok" and asm.chunk_count == 0:
            status = "empty"

        meta: dict[str, Any] = {"chunks": asm.chunk_count}
        if asm.error is not None:
            meta["error"] = asm.error
        if failure is not None:
            meta["error"] = failure["error"]
        if phase is not None:
            meta["phase"] = phase
        self.recorded = True
        try:
            await _record(call, call.step(status=status, status_code=200, response=asm.result(), meta=meta))
        except GatewayError as e:
            call.observe(500)
            yield format_event(json.dumps(error_body(500, e.message, code="telemetry_error")))
            return
        call.observe(200)
        if failure is not None:
            yield format_event(json.dumps(failure))
        elif done_raw is not None:
            yield done_raw
