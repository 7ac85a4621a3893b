"""Relaying one upstream SSE stream to the client and recording it as one step, on every protocol
(docs/gateway-protocols.md, "Stream relay")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, aclosing
from typing import Any

import aiohttp

from gateway.call import Call
from gateway.call_end import CallEnd, Phase
from gateway.capture import strip_chunk
from gateway.errors import GatewayError
from gateway.idempotency import Replay
from gateway.streaming import SSE_HEADERS
from wire.errors import error_body
from wire.jsonsafe import compact, strict_event, with_data
from wire.sse import SSEParser, sse_comment
from wire.status import StepStatus

log = logging.getLogger(__name__)

KEEPALIVE = sse_comment("keep-alive")
"""``b": keep-alive\n"``: one SSE comment line, no blank line after it (see the module docstring)."""


async def read_or_idle(content: aiohttp.StreamReader, idle_s: float) -> bytes | None:
    """The next bytes of an upstream body (``b""`` at its end), or None when none came within
    ``idle_s`` (0: no limit). Inline in the caller's task, so no byte is lost to the timeout."""
    if idle_s <= 0:
        return await content.readany()
    timeout = asyncio.timeout(idle_s)
    try:
        async with timeout:
            return await content.readany()
    except TimeoutError:
        if timeout.expired():
            return None
        raise


class StreamRelay:
    """Relays one upstream SSE stream and records it as one step. :meth:`events` is the response body;
    the response calls :meth:`client_left` when the client goes and always awaits :meth:`finish`."""

    def __init__(self, call: Call, resp: aiohttp.ClientResponse, stack: AsyncExitStack) -> None:
        self.call = call  # handed over: this relay owns the call until finish()
        self.resp = resp
        self.stack = stack
        self.asm = call.proto.assembler()
        self.gone = False
        self.final_status: StepStatus | None = (
            None  # the final step's status once it is recorded (strict: committed)
        )

    def client_left(self) -> None:
        """The client disconnected: stop reading the upstream at once."""
        self.gone = True
        self.resp.close()

    async def finish(self) -> None:
        """Release the upstream connection and route slot, record the partial step when no final one was,
        and end the call, on every path."""
        call = self.call
        try:
            if not call.finished:
                self.resp.close()
                await call.finish(
                    CallEnd(
                        StepStatus.CLIENT_DISCONNECTED,
                        self.resp.status,
                        self.asm.result(),
                        answered=499,
                        meta={"chunks": self.asm.chunk_count},
                        wait=False,
                    )
                )
            await self.stack.aclose()
        finally:
            call.abandon()

    async def events(self) -> AsyncGenerator[bytes, None]:
        """The SSE bytes for the client (see the class docstring); every byte sent is kept (up to
        the per-call cap) so that a retry of an ``ok`` stream is answered with it."""
        claim = self.call.claim
        kept: list[bytes] | None = [] if claim is not None else None
        size, limit = 0, claim.max_bytes if claim is not None else 0
        async with aclosing(self._relay()) as relayed:
            async for chunk in relayed:
                if kept is not None:
                    size += len(chunk)
                    kept = kept if size <= limit else None
                    if kept is not None:
                        kept.append(chunk)
                yield chunk
        if self.final_status == StepStatus.OK:  # every byte went out
            self.call.sent(
                Replay(200, dict(SSE_HEADERS), b"".join(kept), "text/event-stream")
                if kept is not None
                else None
            )

    async def _relay(self) -> AsyncGenerator[bytes, None]:
        call, asm, proto = self.call, self.asm, self.call.proto
        parser = SSEParser()
        held: list[bytes] = []
        failure: tuple[int, dict[str, Any]] | None = None
        phase: Phase | None = None
        status = StepStatus.OK
        non_finite = 0
        if self.gone:
            return
        idle_s = call.gw.settings.keepalive_for(call.route_key)
        try:
            while True:
                data = await read_or_idle(self.resp.content, idle_s)
                if data is None:  # the upstream was silent for the keep-alive interval
                    call.gw.metrics.keepalives.labels(call.route_key).inc()
                    yield KEEPALIVE  # between two whole events: see the module docstring
                    continue
                if not data:
                    break
                if call.ttft_ms is None:
                    call.ttft_ms = (time.perf_counter() - call.t0) * 1000
                    call.gw.metrics.ttft.labels(call.route_key).observe(call.ttft_ms / 1000)
                for ev in parser.feed(data):
                    ev, replaced = strict_event(ev)  # non-finite numbers -> null, before anything sees it
                    non_finite += replaced
                    obj = asm.feed_event(ev)
                    if call.usage_added and proto.hide_event(obj):
                        continue
                    raw = ev.raw
                    if call.capture_added and (stripped := strip_chunk(obj, call.capture_added)) is not None:
                        raw = with_data(ev, compact(stripped)).raw  # what the client did not ask for
                    if held or asm.finished:
                        held.append(raw)
                        continue
                    yield raw
            status = asm.status()
            if status == StepStatus.TRUNCATED:
                failure = (
                    502,
                    error_body(
                        502,
                        f"upstream closed the stream before it finished (no {proto.stream_end})",
                        code="upstream_stream_truncated",
                    ),
                )
        except TimeoutError as e:  # before the connection errors: aiohttp's read timeout is both
            if asm.finished:
                status = asm.status()
            else:
                status = StepStatus.TIMEOUT
                phase = Phase.FIRST_BYTE if call.ttft_ms is None else Phase.IDLE
                failure = 504, call.timeout_error(phase, e)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            if self.gone:
                return  # our own close after the client left; finish() records it
            if asm.finished:
                status = asm.status()
            else:
                status = StepStatus.TRUNCATED
                failure = (
                    502,
                    error_body(
                        502, f"upstream stream broke: {type(e).__name__}: {e}", code="upstream_stream_broken"
                    ),
                )
        except Exception as e:  # a bug or an unforeseen client error: end the stream loudly, keep the step
            log.exception("relaying the stream of route %s failed", call.route_key)
            status = StepStatus.ERROR
            failure = (
                500,
                error_body(
                    500,
                    f"the gateway failed while relaying the stream: {type(e).__name__}: {e}",
                    code="internal_error",
                ),
            )
        await self.stack.aclose()  # release the connection and the route slot before recording
        if self.gone:
            return
        if status == StepStatus.OK and asm.chunk_count == 0:
            status = StepStatus.EMPTY

        response = asm.result()
        meta: dict[str, Any] = {"chunks": asm.chunk_count, **asm.notes()}
        if asm.error is not None:
            meta["error"] = asm.error
        if failure is not None:
            meta["error"] = failure[1]["error"]
        if phase is not None:
            meta["phase"] = phase.value
        if non_finite:
            meta["non_finite_numbers"] = non_finite
        try:
            await call.finish(CallEnd(status, 200, response, answered=200, meta=meta))
        except GatewayError as e:  # finish() counted the 500
            yield proto.stream_error(500, error_body(500, e.message, code="telemetry_error"), asm)
            return
        self.final_status = status
        if failure is not None:
            yield proto.stream_error(failure[0], failure[1], asm)
        else:
            for raw in held:
                yield raw
