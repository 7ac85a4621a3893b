"""Unit tests of the gateway's internals, built directly (no HTTP server in front): the session
manager, one call's finish, the upstream attempts, the stream relay and the strict-JSON rule.
Real SQLite, the real telemetry writer and the one fake upstream; waits are on events."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.call import Call
from gateway.call_end import Attempt, CallEnd, Phase
from gateway.errors import GatewayError
from gateway.exchange import Exchange, UpstreamFailed, before_model
from gateway.idempotency import Replay
from gateway.metrics import Metrics
from gateway.protocols import CHAT
from gateway.recorder import TelemetryWriter
from gateway.relay import StreamRelay
from gateway.sessions import RouteMismatch, SessionClosed, SessionManager
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.upstream import UpstreamClient
from store import Store
from tests.fake_upstream import DONE, FakeUpstream, Reply, chat_chunk, chat_completion
from tests.gateway.conftest import MESSAGES
from wire.jsonsafe import loads_strict, strict_event
from wire.sse import SSEParser
from wire.status import StepStatus

BODY = {"model": "m", "messages": MESSAGES}


async def _ticks(n: int = 5) -> None:
    """Let the loop run ``n`` turns (what a task that can progress needs), without a clock."""
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
async def state(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[GatewayState]:
    settings = GatewaySettings.model_validate(
        {
            "storage_config": {"db_url": f"sqlite://{tmp_path}/u.db"},
            "max_steps": 2,
            "llm_routes": {
                "m": {"base_url": upstream.base_url, "retry": {"backoff_s": 0, "max_attempts": 3}},
                "dead": {
                    "base_url": f"http://127.0.0.1:{_free_port()}/v1",
                    "retry": {"backoff_s": 0, "max_attempts": 2},
                },
            },
        }
    )
    store = Store(settings.storage_config.db_url)
    await store.init()
    metrics = Metrics()
    writer = TelemetryWriter(store, metrics, strict=True, batch_max=16, queue_max=100)
    writer.start()
    up = UpstreamClient(settings.llm_routes)
    await up.start()
    gw = GatewayState(settings, store, SessionManager(store, settings.max_steps), up, writer, metrics)
    try:
        yield gw
    finally:
        await writer.stop()
        await up.close()
        await store.close()


def _count(gw: GatewayState, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _call(gw: GatewayState, sid: str | None = "s1", *, claim: bool = True, **body: Any) -> Call:
    req = CHAT.validate({**BODY, **body})
    pending = (
        gw.sessions.recent_calls.begin(sid, ("body", "chat.completions", "k")) if sid and claim else None
    )
    call = Call(gw, CHAT, req, {**BODY, **body}, pending, sid)
    if sid is not None:
        call.slot = await gw.sessions.reserve(sid, req.model)
    return call


def _ok(body: dict[str, Any]) -> CallEnd:
    return CallEnd(StepStatus.OK, 200, body, answered=200, replay=Replay(200, {}, b"{}", "application/json"))


# ------------------------------------------------------------------------------------------ sessions
async def test_reserve_binds_the_route_and_stops_at_the_budget(state: GatewayState) -> None:
    sm = state.sessions
    a, b = await sm.reserve("s", "m"), await sm.reserve("s", "m")
    assert a is not None and b is not None
    assert ((a.seq, a.step_id), (b.seq, b.step_id)) == ((1, 1), (2, 2))
    with pytest.raises(RouteMismatch) as ei:  # the first reserve bound the session to "m"
        await sm.reserve("s", "other")
    assert (ei.value.bound, ei.value.called) == ("m", "other")
    assert await sm.reserve("s", "m") is None  # max_steps 2
    st = sm.live("s")
    assert st is not None and (st.status, st.total_steps) == ("truncated", 2)
    assert await sm.refund(a) and not await sm.refund(a)  # once per step
    c = await sm.reserve("s", "m")  # the refund freed a unit
    assert c is not None and (c.seq, c.step_id, st.status) == (3, 3, "active")
    for slot in (a, b, c, c):  # release is idempotent
        sm.release(slot)
    assert sm.in_flight("s") == 0


async def test_close_waits_for_the_call_in_flight_then_refuses_new_calls(state: GatewayState) -> None:
    sm = state.sessions
    slot = await sm.reserve("s", "m")
    assert slot is not None
    closing = asyncio.ensure_future(sm.close("s", "done", None, grace_s=30))
    await _ticks()
    assert not closing.done() and sm.closing("s").is_set() and not sm.takes_calls("s")
    with pytest.raises(SessionClosed):
        await sm.reserve("s", "m")
    sm.release(slot)
    snap, truncated = await asyncio.wait_for(closing, 10)
    assert (snap.status, snap.close_reason, truncated) == ("closed", "done", False)
    assert not sm.is_after_close(slot)


async def test_a_call_outliving_the_close_is_after_close_and_forget_waits_for_it(state: GatewayState) -> None:
    sm = state.sessions
    slot = await sm.reserve("s", "m")
    assert slot is not None
    snap, _ = await sm.close("s", None, None, grace_s=0)
    assert snap.status == "closed" and sm.is_after_close(slot)
    sm.forget("s")
    assert sm.holds("s") and sm.live("s") is None  # kept for its call in flight only
    assert not await sm.refund(slot)  # nothing left to spend the unit on
    sm.release(slot)
    assert not sm.holds("s")


# ------------------------------------------------------------------------------------------ Call.finish
async def test_finish_records_counts_settles_and_releases_once(state: GatewayState) -> None:
    call = await _call(state)
    assert call.claim is not None and state.sessions.in_flight("s1") == 1
    answer = chat_completion("hi")
    await call.finish(_ok(answer))
    await call.finish(CallEnd(StepStatus.ERROR, 500, {}, answered=500))  # a second ending is a no-op
    [step] = await state.store.trajectory("s1")
    assert (step.status, step.status_code, step.response, step.is_trainable) == ("ok", 200, answer, True)
    assert step.meta_json == {"route": "m"}
    assert call.claim.settled and call.claim.replay is not None
    assert state.sessions.in_flight("s1") == 0
    assert _count(state, "gateway_requests_total", endpoint="chat.completions", route="m", status="200") == 1
    assert _count(state, "gateway_requests_total", endpoint="chat.completions", route="m", status="500") == 0


async def test_a_refunded_failure_gives_the_unit_back_and_is_not_trainable(state: GatewayState) -> None:
    call = await _call(state)
    call.attempts = [Attempt(None, error="refused", wait_s=0.0), Attempt(None, error="refused")]
    await call.finish(
        CallEnd(
            StepStatus.ERROR,
            502,
            {"error": {}},
            answered=502,
            meta={"phase": Phase.CONNECT.value},
            refund=True,
        )
    )
    [step] = await state.store.trajectory("s1")
    assert step.meta_json is not None
    assert (step.status, step.is_trainable, step.meta_json["budget_refunded"]) == ("error", False, True)
    assert [a["error"] for a in step.meta_json["attempts"]] == ["refused", "refused"]
    assert call.claim is not None and call.claim.settled and call.claim.replay is None  # failed
    st = state.sessions.live("s1")
    assert st is not None and (st.total_steps, st.refunded_steps) == (1, 1)


async def test_abandon_releases_and_fails_the_claim_without_a_row(state: GatewayState) -> None:
    call = await _call(state)
    call.abandon()
    call.abandon()
    assert state.sessions.in_flight("s1") == 0
    assert call.claim is not None and call.claim.settled and call.claim.replay is None
    assert await state.store.trajectory("s1") == []


async def test_a_commit_that_fails_is_a_500_and_the_call_is_still_ended(
    state: GatewayState, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(steps: object, sessions: object, **kw: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(state.store, "write_batch", broken)
    monkeypatch.setattr(state.store, "commit_now", lambda steps, sessions: False)
    call = await _call(state)
    with pytest.raises(GatewayError) as ei:
        await call.finish(_ok(chat_completion("lost")))
    assert (ei.value.status, ei.value.code) == (500, "telemetry_error")
    assert state.sessions.in_flight("s1") == 0 and call.claim is not None and call.claim.replay is None
    assert _count(state, "gateway_requests_total", endpoint="chat.completions", route="m", status="500") == 1


async def test_an_ok_stream_keeps_its_claim_open_until_its_bytes_went_out(state: GatewayState) -> None:
    call = await _call(state, stream=True)
    await call.finish(CallEnd(StepStatus.OK, 200, chat_completion("x"), answered=200))
    assert call.claim is not None and not call.claim.settled
    call.sent(Replay(200, {}, b"data: [DONE]\n\n", "text/event-stream"))
    assert call.claim.replay is not None and call.claim.replay.body == b"data: [DONE]\n\n"


# ------------------------------------------------------------------------------------------ Exchange
async def test_exchange_retries_a_429_and_lists_every_attempt(
    state: GatewayState, upstream: FakeUpstream
) -> None:
    upstream.script(
        "/v1/chat/completions",
        [
            Reply.json({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"}),
            Reply.json(chat_completion("second")),
        ],
    )
    call = await _call(state, claim=False)
    exchange = Exchange(
        call, b'{"model":"m","messages":[]}', {"Content-Type": "application/json"}, relay_sse=False
    )
    content = await exchange.run()
    await exchange.close(abort=False)
    assert content is not None and b"second" in content
    assert call.attempts == [Attempt(429, retry_after_s=0.0, wait_s=0.0), Attempt(200)]
    assert _count(state, "gateway_upstream_retries_total", route="m", reason="status_429") == 1


async def test_exchange_connect_failure_is_before_the_model_after_its_attempts(state: GatewayState) -> None:
    req = CHAT.validate({**BODY, "model": "dead"})
    call = Call(state, CHAT, req, {**BODY, "model": "dead"}, None, None)
    exchange = Exchange(call, b"{}", {"Content-Type": "application/json"}, relay_sse=False)
    with pytest.raises(UpstreamFailed) as ei:
        await exchange.run()
    await exchange.close(abort=True)
    f = ei.value
    assert (f.status, f.step_status, f.phase, f.retry_reason) == (
        502,
        StepStatus.ERROR,
        Phase.CONNECT,
        "connect_error",
    )
    assert before_model(f) and len(call.attempts) == 2 and call.attempts[0].wait_s == 0.0


# ------------------------------------------------------------------------------------------ StreamRelay
async def _relay(
    state: GatewayState, upstream: FakeUpstream, chunks: list[bytes]
) -> tuple[Call, StreamRelay]:
    upstream.script("/v1/chat/completions", [Reply.sse(chunks)])
    call = await _call(state, stream=True)
    exchange = Exchange(
        call,
        b'{"model":"m","messages":[],"stream":true}',
        {"Content-Type": "application/json"},
        relay_sse=True,
    )
    assert await exchange.run() is None  # a stream to relay
    assert exchange.resp is not None
    return call, StreamRelay(call.hand_over(), exchange.resp, exchange.stack)


async def test_relay_sends_the_upstream_bytes_and_records_one_ok_step(
    state: GatewayState, upstream: FakeUpstream
) -> None:
    chunks = [chat_chunk("hel", role="assistant"), chat_chunk("lo"), chat_chunk(finish_reason="stop"), DONE]
    call, relay = await _relay(state, upstream, chunks)
    sent = [b async for b in relay.events()]
    await relay.finish()
    assert b"".join(sent) == b"".join(chunks)  # byte for byte
    assert relay.final_status == StepStatus.OK and state.sessions.in_flight("s1") == 0
    [step] = await state.store.trajectory("s1")
    assert (step.status, step.response["choices"][0]["message"]["content"]) == ("ok", "hello")
    assert call.claim is not None and call.claim.replay is not None
    assert call.claim.replay.body == b"".join(chunks)  # a retry gets every byte sent


async def test_relay_whose_client_left_records_the_partial_answer(
    state: GatewayState, upstream: FakeUpstream
) -> None:
    chunks = [chat_chunk("partial", role="assistant"), chat_chunk(" more"), DONE]
    call, relay = await _relay(state, upstream, chunks)
    events = relay.events()
    first = await events.__anext__()
    assert first == chunks[0]
    relay.client_left()
    await events.aclose()
    await relay.finish()
    [step] = await state.store.trajectory("s1")
    assert (
        step.status == "client_disconnected"
        and step.response["choices"][0]["message"]["content"] == "partial"
    )
    assert call.claim is not None and call.claim.settled and call.claim.replay is None
    assert state.sessions.in_flight("s1") == 0


# ------------------------------------------------------------------------------------------ strict JSON
def test_strict_event_rewrites_only_the_data_and_keeps_the_other_lines() -> None:
    [ev] = SSEParser().feed(
        b'event: delta\r\nid: 7\r\n: note\r\ndata: {"lp": -Infinity,\r\ndata:  "x": NaN}\r\n\r\n'
    )
    out, n = strict_event(ev)
    assert n == 2 and out.data == '{"lp":null,"x":null}'
    assert out.raw == b'event: delta\nid: 7\n: note\ndata: {"lp":null,"x":null}\n\n'
    assert (out.event, out.id) == ("delta", "7")
    [plain] = SSEParser().feed(b'data: {"text": "NaN"}\n\n')
    assert strict_event(plain)[0] is plain  # nothing to replace: the same event, same bytes
    assert loads_strict("[1, Infinity, NaN]") == ([1, None, None], 2)
