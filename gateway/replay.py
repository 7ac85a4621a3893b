"""Answering SDK retries of a session's call (:mod:`gateway.idempotency` decides what a retry is):
replay the first call's answer, or join it while it is in flight.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import Response

from gateway.answers import gone
from gateway.disconnect import ClientGone, unless_client_leaves
from gateway.idempotency import PendingCall, Replay, call_key
from gateway.protocols import WireProtocol
from gateway.state import GatewayState
from wire.requests import WireRequest

log = logging.getLogger(__name__)

REPLAYED_HEADER = {"x-gateway-replayed": "true"}


async def replay_or_claim(
    gw: GatewayState, request: Request, sid: str, proto: WireProtocol, req: WireRequest, raw: bytes
) -> tuple[Response | None, PendingCall | None]:
    """``(answer, None)`` for a retry of a remembered call of session ``sid`` (waiting for it
    while it is in flight), else ``(None, claim)``: the :class:`PendingCall` under which this
    call is remembered, owned by the caller's :class:`gateway.call.Call` from then on. A retry
    recognised by its body joins a call in flight only once that call's client has left
    (:attr:`PendingCall.client_left`); with an ``Idempotency-Key`` it always joins. When the
    call waited for failed, this call looks again (another retry may have taken over meanwhile)
    and otherwise becomes a new call. A client that leaves while waiting gets 499 (nothing
    recorded)."""
    table = gw.sessions.recent_calls
    key, maybe_retry = call_key(request.headers, proto.endpoint, raw)
    while True:
        seen = table.find(sid, key) if maybe_retry else None
        if seen is None:
            return None, table.begin(sid, key)
        replay = seen.replay
        if replay is None and key[0] == "body" and not seen.client_left:
            # an SDK retries a call only after its own request failed, so a call still in flight
            # with its client connected is another call with the same body (parallel samples of
            # one prompt): never cross-wire their answers
            return None, table.begin(sid, key)
        if replay is None:  # in flight: join it
            try:
                replay = await unless_client_leaves(request.receive, seen.wait())
            except ClientGone:
                gw.metrics.answer(proto.endpoint, req.model, 499)
                return gone(
                    proto, "the client closed the connection while waiting for the call it retried"
                ), None
            if replay is None:
                continue
        return replayed(gw, proto, req, replay), None


def replayed(gw: GatewayState, proto: WireProtocol, req: WireRequest, replay: Replay) -> Response:
    """A remembered answer sent again (header ``x-gateway-replayed: true``), counted in
    ``/metrics``; no upstream call, no step."""
    gw.metrics.idempotent_replays.labels(proto.endpoint).inc()
    gw.metrics.answer(proto.endpoint, req.model, replay.status_code)
    log.info("%s call of route %s answered with the answer of the call it retries", proto.endpoint, req.model)
    return Response(
        content=replay.body,
        status_code=replay.status_code,
        media_type=replay.media_type,
        headers={**replay.headers, **REPLAYED_HEADER},
    )
