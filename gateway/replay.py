"""Answering SDK retries of a session's call (:mod:`gateway.idempotency` decides what a retry is):
replay the first call's answer or join it while it is in flight, and keep a relayed stream's
bytes so that its retries can be replayed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.disconnect import ClientGone, unless_client_leaves
from gateway.errors import error_body
from gateway.idempotency import PendingCall, Replay, call_key
from gateway.protocols import WireProtocol
from gateway.relay import StreamRelay
from gateway.state import GatewayState
from gateway.streaming import SSE_HEADERS
from gateway.wire import WireRequest

log = logging.getLogger(__name__)

REPLAYED_HEADER = {"x-gateway-replayed": "true"}


async def replay_or_claim(gw: GatewayState, request: Request, sid: str, proto: WireProtocol, req: WireRequest,
                           raw: bytes) -> Response | PendingCall:
    """The answer to a retry of a remembered call of session ``sid`` (waiting for it while it is
    in flight), or the :class:`PendingCall` under which this call is remembered: the caller
    makes the call and must settle it. A retry recognised by its body joins a call in flight only
    once that call's client has left (:attr:`PendingCall.client_left`); with an
    ``Idempotency-Key`` it always joins. When the call waited for failed, this call looks again
    (another retry may have taken over meanwhile) and otherwise becomes a new call. A client
    that leaves while waiting gets 499 (nothing recorded)."""
    table = gw.sessions.recent_calls
    key, maybe_retry = call_key(request.headers, proto.endpoint, raw)
    while True:
        seen = table.find(sid, key) if maybe_retry else None
        if seen is None:
            return table.begin(sid, key)
        replay = seen.replay
        if replay is None and key[0] == "body" and not seen.client_left:
            # an SDK retries a call only after its own request failed, so a call still in flight
            # with its client connected is another call with the same body (parallel samples of
            # one prompt): never cross-wire their answers
            return table.begin(sid, key)
        if replay is None:  # in flight: join it
            try:
                replay = await unless_client_leaves(request.receive, seen.wait())
            except ClientGone:
                gw.metrics.requests.labels(proto.endpoint, req.model, "499").inc()
                err = error_body(499, "the client closed the connection while waiting for the call it retried",
                                 code="client_disconnected", type_="client_disconnected")
                return JSONResponse(proto.client_error(499, err), status_code=499)  # nobody reads it
            if replay is None:
                continue
        return replayed(gw, proto, req, replay)


def replayed(gw: GatewayState, proto: WireProtocol, req: WireRequest, replay: Replay) -> Response:
    """A remembered answer sent again (header ``x-gateway-replayed: true``), counted in
    ``/metrics``; no upstream call, no step."""
    gw.metrics.idempotent_replays.labels(proto.endpoint).inc()
    gw.metrics.requests.labels(proto.endpoint, req.model, str(replay.status_code)).inc()
    log.info("%s call of route %s answered with the answer of the call it retries", proto.endpoint, req.model)
    return Response(content=replay.body, status_code=replay.status_code, media_type=replay.media_type,
                    headers={**replay.headers, **REPLAYED_HEADER})


async def kept_stream(events: AsyncIterator[bytes], relay: StreamRelay, claim: PendingCall) -> AsyncIterator[bytes]:
    """``events`` passed through while every byte is kept (up to the per-call cap of the recent
    calls table); once they all went out and the relay recorded an ``ok`` step, ``claim`` is
    done with them as its replay (HTTP 200, ``text/event-stream``), otherwise it fails. A stream
    the client left is settled by :func:`settle_after`."""
    kept: list[bytes] | None = []
    size, limit = 0, claim.max_bytes
    try:
        async for chunk in events:
            if kept is not None:
                size += len(chunk)
                if size > limit:
                    kept = None
                else:
                    kept.append(chunk)
            yield chunk
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    if kept is not None and relay.outcome == "ok":
        claim.done(Replay(200, dict(SSE_HEADERS), b"".join(kept), "text/event-stream"))
    else:
        claim.fail()


def settle_after(finish: Callable[[], Awaitable[None]], claim: PendingCall) -> Callable[[], Awaitable[None]]:
    """``finish`` followed by failing ``claim`` when the stream did not settle it (the client
    left, the stream never ran, an error)."""

    async def finalize() -> None:
        try:
            await finish()
        finally:
            claim.fail()  # a no-op once done

    return finalize
