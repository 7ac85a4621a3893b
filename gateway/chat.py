"""``POST .../chat/completions``: forward to the route's upstream, stream back, record the step.

Fidelity rules: the client's JSON body is forwarded as received (re-encoded only when the gateway
must change it: ``upstream_model``, or adding ``stream_options.include_usage`` to meter a stream);
upstream SSE events are relayed byte for byte as they are parsed (comment and data-less blocks are
not relayed, see faults F2); the recorded response of a stream is the assembled completion.
In strict telemetry mode a step is committed before the client receives ``[DONE]`` (or, without
streaming, the response).
"""

from __future__ import annotations

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
from gateway.errors import GatewayError, error_body
from gateway.redact import redact_request
from gateway.sessions import SessionClosed, StepSlot
from gateway.sse import SSEParser, format_event
from gateway.state import GatewayState
from gateway.synthetic import STOP_HEADER, chat_stop_completion, chat_stop_stream
from gateway.wire import parse_json_body, validate_chat
from store import GatewaySession, SessionStep

log = logging.getLogger(__name__)

ENDPOINT = "chat.completions"
_RELAYED_HEADERS = ("retry-after", "x-request-id", "openai-processing-ms")


def _is_usage_only(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("choices") == [] and obj.get("usage") is not None


class _Call:
    """One chat call in flight: what is needed to build its step row."""

    def __init__(self, gw: GatewayState, route_key: str, body: dict[str, Any], upstream_body: dict[str, Any],
                 slot: StepSlot | None, snapshot: GatewaySession | None, stream: bool, usage_added: bool) -> None:
        self.gw = gw
        self.route_key = route_key
        self.body = body
        self.upstream_body = upstream_body
        self.slot = slot
        self.snapshot = snapshot
        self.stream = stream
        self.usage_added = usage_added
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None

    def step(self, *, status: str, status_code: int | None, response: Any, meta: dict[str, Any] | None = None
             ) -> SessionStep | None:
        """Build the step row (None for sessionless calls)."""
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
        return SessionStep(
            session_id=s.session_id, seq=s.seq, step_id=s.step_id, env_name=s.env_name, group_id=s.group_id,
            job_id=s.job_id, llm_model=self.route_key, endpoint=ENDPOINT, is_stream=self.stream, status=status,
            status_code=status_code, messages=self.body.get("messages"), request=redact_request(self.upstream_body),
            response=response, finish_reason=finish if isinstance(finish, str) else None,
            prompt_tokens=_int(usage, "prompt_tokens"), completion_tokens=_int(usage, "completion_tokens"),
            total_tokens=_int(usage, "total_tokens"),
            latency_ms=(time.perf_counter() - self.t0) * 1000, ttft_ms=self.ttft_ms,
            is_truncated=status == "truncated", meta_json=meta_json,
        )

    def observe(self, http_status: int) -> None:
        m = self.gw.metrics
        m.requests.labels(ENDPOINT, self.route_key, str(http_status)).inc()
        m.latency.labels(ENDPOINT, self.route_key).observe(time.perf_counter() - self.t0)


def _int(usage: dict[str, Any] | None, key: str) -> int | None:
    v = usage.get(key) if isinstance(usage, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


async def handle_chat(gw: GatewayState, request: Request, session_id: str | None) -> Response:
    """Serve one chat completion call; ``session_id`` None means passthrough (not recorded)."""
    body = parse_json_body(await request.body())
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
    snapshot: GatewaySession | None = None
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

    upstream_body = body
    usage_added = False
    if route.upstream_model:
        upstream_body = {**upstream_body, "model": route.upstream_model}
    if stream and not client_usage:
        upstream_body = {**upstream_body, "stream_options": {**(req.stream_options or {}), "include_usage": True}}
        usage_added = True
    payload = json.dumps(upstream_body).encode() if upstream_body is not body else await request.body()

    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    if route.api_key:
        headers["Authorization"] = f"Bearer {route.api_key}"
    headers.update(route.extra_headers)
    if session_id is not None:
        headers["X-Session-Id"] = session_id

    call = _Call(gw, route_key, body, upstream_body, slot, snapshot, stream, usage_added)
    stack = AsyncExitStack()
    try:
        resp = await stack.enter_async_context(gw.upstream.post(route_key, "/chat/completions", payload, headers))
    except (aiohttp.ClientError, TimeoutError) as e:
        await stack.aclose()
        timeout = isinstance(e, TimeoutError)
        status = 504 if timeout else 502
        msg = f"upstream {route_key} {'timed out' if timeout else 'unreachable'}: {type(e).__name__}: {e}"
        err = error_body(status, msg, code="upstream_timeout" if timeout else "upstream_unreachable")
        await _record(call, call.step(status="timeout" if timeout else "error", status_code=status, response=err,
                                      meta={"phase": "connect"}))
        call.observe(status)
        return JSONResponse(err, status_code=status)

    is_sse = resp.content_type == "text/event-stream"
    if stream and resp.status == 200 and is_sse:
        return StreamingResponse(_relay_stream(call, resp, stack), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        content = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        await stack.aclose()
        err = error_body(502, f"upstream {route_key} failed while sending its answer: {type(e).__name__}: {e}")
        await _record(call, call.step(status="error", status_code=502, response=err, meta={"phase": "body"}))
        call.observe(502)
        return JSONResponse(err, status_code=502)
    finally:
        await stack.aclose()
    return await _relay_plain(call, resp.status, resp.headers, content)


async def _iter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def _record(call: _Call, step: SessionStep | None) -> None:
    """Commit a step (strict: wait for the commit). Raises GatewayError(500) when it fails."""
    if step is None:
        return
    try:
        await call.gw.writer.record(step, call.snapshot)
    except Exception as e:
        raise GatewayError(500, f"the gateway could not record this call: {type(e).__name__}: {e}",
                           code="telemetry_error") from e


async def _relay_plain(call: _Call, status: int, up_headers: Any, content: bytes) -> Response:
    """Relay a non-streamed upstream answer (success or error) with its status and body."""
    try:
        parsed: Any = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    ok = 200 <= status < 300 and isinstance(parsed, dict) and "error" not in parsed
    if parsed is None:
        recorded: Any = {"raw_body": content[:65536].decode("utf-8", "replace"),
                         "content_type": up_headers.get("Content-Type")}
    else:
        recorded = parsed
    meta = {} if ok else {"error": _error_text(parsed, content)}
    await _record(call, call.step(status="ok" if ok else "error", status_code=status, response=recorded, meta=meta))
    headers = {k: v for k in _RELAYED_HEADERS if (v := up_headers.get(k)) is not None}
    call.observe(status)
    media = up_headers.get("Content-Type", "application/json")
    return Response(content=content, status_code=status, headers=headers, media_type=media)


def _error_text(parsed: Any, content: bytes) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message"))
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return content[:500].decode("utf-8", "replace")


async def _relay_stream(call: _Call, resp: aiohttp.ClientResponse, stack: AsyncExitStack) -> AsyncIterator[bytes]:
    """Relay SSE events as they arrive; record the assembled step when the stream ends.

    End states: ``[DONE]`` (or a finish_reason) → ok, committed before ``[DONE]`` is relayed;
    an ``{"error": ...}`` event → error; EOF or a broken connection without ``[DONE]`` → truncated,
    and the client gets an error event instead of a fake ``[DONE]``; a read timeout → timeout;
    the client going away (task cancelled) → ``client_disconnected``, the upstream connection is
    closed at once and the partial step recorded.
    """
    parser = SSEParser()
    asm = ChatStreamAssembler()
    done_raw: bytes | None = None
    failure: dict[str, Any] | None = None
    status = "ok"
    try:
        async for data in resp.content.iter_any():
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
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
        status = "truncated"
        failure = error_body(502, f"upstream stream broke: {type(e).__name__}: {e}", code="upstream_stream_broken")
    except TimeoutError:
        status = "timeout"
        phase = "first-byte" if call.ttft_ms is None else "idle"
        failure = error_body(504, f"upstream stream timed out ({phase})", code="upstream_timeout")
    except BaseException:  # cancelled: the client went away, or the server is shutting down
        resp.close()
        call.gw.writer.submit(call.step(status="client_disconnected", status_code=200, response=asm.result(),
                                        meta={"chunks": asm.chunk_count}), call.snapshot)
        call.observe(499)
        raise
    finally:
        await stack.aclose()  # releases the connection (closes it when the body was not read to the end)

    meta: dict[str, Any] = {"chunks": asm.chunk_count}
    if asm.error is not None:
        meta["error"] = asm.error
    if failure is not None:
        meta["error"] = failure["error"]
        if status == "timeout":
            meta["phase"] = "first-byte" if call.ttft_ms is None else "idle"
    step = call.step(status=status, status_code=200, response=asm.result(), meta=meta)
    try:
        await _record(call, step)
    except GatewayError as e:
        call.observe(500)
        yield format_event(json.dumps(error_body(500, e.message, code="telemetry_error")))
        return
    call.observe(200)
    if failure is not None:
        yield format_event(json.dumps(failure))
    elif done_raw is not None:
        yield done_raw
