"""The one forwarding core behind every model-call endpoint (chat completions, Responses,
Anthropic Messages differ only in their :mod:`gateway.protocols` adapter).

:func:`handle` validates, answers a retry from its first call (:mod:`gateway.replay`), opens
the :class:`gateway.call.Call`, reserves a step and forwards. The call has one owner: this
module until it returns, then (explicitly, :meth:`Call.hand_over`) the stream relay
(:mod:`gateway.relay`) or the detached task of a call kept for its retry. Every ending goes
through :meth:`Call.finish`; anything left is ended by :meth:`Call.abandon` in ``handle``'s
``finally``. Step statuses, retries, refunds and replays: docs/gateway-semantics.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from gateway import answers
from gateway.bodies import check_session_id, parse_json_body, read_body
from gateway.call import Call
from gateway.call_end import CallEnd
from gateway.capture import upstream_fields
from gateway.client_headers import correlation_headers, session_from_headers
from gateway.disconnect import ClientGone, unless_client_leaves
from gateway.errors import GatewayError
from gateway.exchange import Exchange, UpstreamFailed
from gateway.idempotency import may_retry
from gateway.protocols import CHAT, WireProtocol
from gateway.relay import StreamRelay
from gateway.replay import replay_or_claim
from gateway.sessions import RouteMismatch, SessionClosed
from gateway.state import GatewayState
from gateway.streaming import SSE_HEADERS, GuardedStreamingResponse
from gateway.upstream import route_base_url
from wire.errors import set_error_shape

log = logging.getLogger(__name__)


async def handle(gw: GatewayState, request: Request, session_id: str | None, proto: WireProtocol) -> Response:
    """Serve one model call of protocol ``proto`` in session ``session_id`` (the path's), else in the
    session its headers name (``session_headers``), else passthrough (not recorded). Errors the
    gateway answers itself are raised as GatewayError (400 bad body or session id, route of another
    api or another route than the session's, 404 unknown route, 409 closed session, 413 body too
    large); upstream answers and failures are answered by the call (see docs/gateway-semantics.md).
    A recorded call's answer names its step (:meth:`Call.step_headers`)."""
    set_error_shape(request, proto.client_error)
    header = None
    if session_id is not None:
        check_session_id(session_id)
    elif gw.session_headers and (found := session_from_headers(request.scope["headers"], gw.session_headers)):
        session_id, header = found
        request.state.session_id = session_id  # the session its refusals are counted for
    elif gw.settings.require_session:
        names = ", ".join(gw.settings.session_headers) or "none configured"
        raise GatewayError(
            400,
            f"this gateway records every model call in a session: call a session URL "
            f"({gw.settings.base_session_path}/<session_id>/...) or send the session id in "
            f"a header ({names})",
            code="session_required",
        )
    raw = await read_body(request, gw.settings.max_request_bytes)
    body = parse_json_body(raw)
    req = proto.validate(body)
    route_key = check_route(gw, proto.api, proto.endpoint, req.model, session_id)
    claim = None
    if session_id is not None:
        replayed, claim = await replay_or_claim(gw, request, session_id, proto, req, raw)
        if replayed is not None:
            return replayed
    call = Call(gw, proto, req, body, claim, session_id, route_key)
    call.client_headers = correlation_headers(request.headers)
    call.session_header = header
    try:
        if gw.policy.paused:  # POST /admin/pause: wait for the resume (a client that leaves: 499)
            try:
                await unless_client_leaves(request.receive, call.admit())
            except ClientGone:
                gw.metrics.answer(proto.endpoint, req.model, 499)
                return answers.gone(proto, "the client closed the connection while model calls were paused")
        else:
            call.admit_now()
        if session_id is not None:
            try:
                call.slot = await gw.sessions.reserve(session_id, route_key)
            except SessionClosed:
                raise GatewayError(409, f"session {session_id} is closed", code="session_closed") from None
            except RouteMismatch as e:
                raise GatewayError(
                    400,
                    f"session {session_id} is bound to route `{e.bound}` (the route it was "
                    f"started on); this call names `{req.model}` (route `{route_key}`). Every "
                    "call of a session must name its route or an alias of it",
                    code="session_route_mismatch",
                    param="model",
                ) from None
            if call.slot is None:
                return await _finish(call, answers.synthetic_stop(call))
        response = await _forward(call, request, raw)
        if call.slot is not None:
            response.headers.update(call.step_headers())
        return response
    finally:
        if not call.handed_over:
            call.abandon()  # a no-op once finished; else (a bug, a shutdown) release and fail the claim


def check_route(gw: GatewayState, api: str | None, endpoint: str, model: str, session_id: str | None) -> str:
    """The route key ``model`` names (a key or an alias, :meth:`GatewaySettings.resolve_route`).
    Raises GatewayError 404 ``model_not_found`` for none, 400 ``route_api_mismatch`` for a route
    of another ``api`` (None: any), 400 ``session_required`` (:func:`route_base_url`)."""
    key = gw.settings.resolve_route(model)
    if key is None:
        known = ", ".join(sorted(gw.settings.llm_routes)) or "none"
        raise GatewayError(
            404,
            f"The model `{model}` does not exist (no such route or alias; routes: {known})",
            code="model_not_found",
            param="model",
        )
    route = gw.settings.llm_routes[key]
    if api is not None and route.api != api:
        raise GatewayError(
            400,
            f"route `{key}` speaks the {route.api} API, which does not serve {endpoint} calls",
            code="route_api_mismatch",
            param="model",
        )
    route_base_url(key, route, session_id)  # a per-session route without a usable session: 400, no budget
    return key


async def _finish(call: Call, ending: tuple[CallEnd, Response]) -> Response:
    end, response = ending
    await call.finish(end)
    return response


async def _forward(call: Call, request: Request, raw: bytes) -> Response:
    """Call the route's upstream and answer the client (see the module docstring)."""
    gw, proto, req = call.gw, call.proto, call.req
    route = gw.settings.llm_routes[call.route_key]
    call.upstream_body, call.usage_added = proto.upstream_body(req, call.body, route)
    if call.upstream_body.get("model") != (target := route.upstream_model or call.route_key):
        call.upstream_body = {**call.upstream_body, "model": target}  # called by an alias: the route's model
    if route.capture is not None and proto.endpoint == CHAT.endpoint:
        added = upstream_fields(call.body, route.capture)
        if added:  # token capture: ask for what a trainer needs (docs/tokens.md)
            call.upstream_body = {**call.upstream_body, **added}
            call.capture_added = frozenset(added)
    upstream_streams = call.stream and route.supports_stream
    payload = raw if call.upstream_body is call.body else json.dumps(call.upstream_body).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream" if upstream_streams else "application/json",
    }
    headers.update(proto.upstream_headers(route, request.headers))
    headers.update(route.extra_headers)
    if call.session_id is not None:
        headers["X-Session-Id"] = call.session_id

    exchange = Exchange(call, payload, headers, relay_sse=upstream_streams)
    run = asyncio.ensure_future(exchange.run())
    detachable = (
        call.claim is not None
        and not call.stream
        and gw.settings.retry_join_window_s > 0
        and may_retry(request.headers)
    )
    try:
        content = await unless_client_leaves(request.receive, asyncio.shield(run) if detachable else run)
    except ClientGone:
        if detachable and not exchange.backing_off:
            return _detach(call.hand_over(), exchange, run)
        run.cancel()
        await asyncio.wait({run})
        await exchange.close(abort=True)
        return await _finish(call, answers.client_left(call, backing_off=exchange.backing_off))
    except UpstreamFailed as f:
        await exchange.close(abort=True)
        return await _finish(call, answers.failed(call, f))
    except BaseException:
        run.cancel()
        await exchange.close(abort=True)
        raise
    resp = exchange.resp
    assert resp is not None
    if content is None:  # a 200 SSE stream: the relay owns the call and the connection from here
        relay = StreamRelay(call.hand_over(), resp, exchange.stack)
        return GuardedStreamingResponse(
            relay.events(),
            on_disconnect=relay.client_left,
            finalize=relay.finish,
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    await exchange.close(abort=False)
    if call.stream and resp.status == 200:
        answer, replaced = answers.parse_answer(proto, content)
        if answer is not None:
            return await _finish(call, answers.synthesized(call, resp.headers, answer, replaced))
    return await _finish(call, answers.plain(call, resp.status, resp.headers, content))


def _detach(call: Call, exchange: Exchange, run: asyncio.Future[bytes | None]) -> Response:
    """The client left a non-streamed call it can retry (an SDK read timeout): the upstream call
    goes on in a background task that owns the call, so the SDK's retry joins it (one model
    call, one step; ``retry_join_window_s``)."""
    assert call.claim is not None
    call.left()
    call.claim.client_left = True
    task = asyncio.create_task(_run_detached(call, exchange, run))
    call.gw.detached.add(task)  # a strong reference, and what a shutdown waits for
    task.add_done_callback(call.gw.detached.discard)
    return answers.gone(
        call.proto, "the client closed the connection before the answer; the call goes on for its retry"
    )


async def _run_detached(call: Call, exchange: Exchange, run: asyncio.Future[bytes | None]) -> None:
    """The background half of :func:`_detach`: an ``ok`` answer waits up to the join window for
    a retry (recorded ``ok`` and answered from it) and is otherwise recorded
    ``client_disconnected`` with the answer kept; a session that starts closing, or a gateway
    that stops, ends the wait (an upstream call still running is cancelled)."""
    gw, claim = call.gw, call.claim
    assert claim is not None and call.session_id is not None
    closing = gw.closing(call.session_id)
    try:
        either: list[asyncio.Future[Any]] = [run, closing]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            run.cancel()
            await asyncio.wait({run})
            await exchange.close(abort=True)
            await _finish(call, answers.client_left(call, backing_off=False))
            return
        try:
            content = run.result()
        except UpstreamFailed as f:
            await exchange.close(abort=True)
            await _finish(call, answers.failed(call, f))
            return
        resp = exchange.resp
        assert resp is not None and content is not None
        await exchange.close(abort=False)
        if 200 <= resp.status < 300 and not await claim.wanted(gw.settings.retry_join_window_s, closing):
            await call.finish(answers.unclaimed(call, resp.status, content))
            return
        await _finish(call, answers.plain(call, resp.status, resp.headers, content))
    except Exception:
        log.exception("the detached call of session %s failed", call.session_id)
    finally:
        closing.cancel()
        call.abandon()
