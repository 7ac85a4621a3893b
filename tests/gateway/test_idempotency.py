"""Gateway contract for retries of a session's call (:mod:`gateway.idempotency`): a retry
(``x-stainless-retry-count`` > 0 with the same body bytes, or the same ``Idempotency-Key``) is
answered with the first call's answer (replayed when done, joined while in flight), with the
header ``x-gateway-replayed: true``, no upstream call, no budget and no step; a repeated body
without the retry header, a retry of a failed call, and a passthrough call are new calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.idempotency import RecentCalls, Replay, call_key
from tests.fake_upstream import (
    DEFAULT_TEXT,
    FakeUpstream,
    Reply,
    chat_completion,
    default_responses_stream,
    response_object,
)
from tests.gateway.conftest import MESSAGES, NO_RETRY, Gateway, StartGateway, anthropic_routes, sse_json

UP_PATH = "/v1/chat/completions"
CHAT = "/v1/sessions/s1/chat/completions"
RETRY = {"x-stainless-retry-count": "1"}
REPLAYED = "x-gateway-replayed"
BUSY = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}


def chat_body(stream: bool = False, text: str = "hi") -> bytes:
    """A chat request body as raw bytes (sent byte for byte, so a retry can repeat them)."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def post(gw: Gateway, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return await gw.http().post(
        path, content=body, headers={"content-type": "application/json", **(headers or {})}
    )


async def status(gw: Gateway, sid: str = "s1") -> dict[str, Any]:
    r = await gw.http().get(f"/v1/sessions/{sid}")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


# (endpoint label, session path, request body)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat.completions", CHAT, {"model": "m", "messages": MESSAGES}),
    ("chat.completions", CHAT, {"model": "m", "messages": MESSAGES, "stream": True}),
    ("responses", "/v1/sessions/s1/responses", {"model": "m", "input": "hi"}),
    ("responses", "/v1/sessions/s1/responses", {"model": "m", "input": "hi", "stream": True}),
    ("messages", "/v1/sessions/s1/v1/messages", {"model": "a", "max_tokens": 16, "messages": MESSAGES}),
    (
        "messages",
        "/v1/sessions/s1/v1/messages",
        {"model": "a", "max_tokens": 16, "messages": MESSAGES, "stream": True},
    ),
]


@pytest.mark.parametrize(
    ("endpoint", "path", "body"),
    CASES,
    ids=[f"{e}-{'stream' if b.get('stream') else 'json'}" for e, _, b in CASES],
)
async def test_retry_of_a_finished_call_is_replayed(
    start_gateway: StartGateway, upstream: FakeUpstream, endpoint: str, path: str, body: dict[str, Any]
) -> None:
    gw = await start_gateway(routes=anthropic_routes(upstream))
    raw = json.dumps(body).encode()
    first = await post(gw, path, raw, {"x-stainless-retry-count": "0"})
    assert first.status_code == 200 and REPLAYED not in first.headers
    assert DEFAULT_TEXT.split()[0].encode() in first.content
    again = await post(gw, path, raw, RETRY)
    assert again.status_code == 200
    assert again.headers[REPLAYED] == "true"
    assert again.content == first.content  # byte for byte, a stream too
    assert again.headers["content-type"] == first.headers["content-type"]
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert (step.seq, step.endpoint, step.status) == (1, endpoint, "ok")
    st = await status(gw)
    assert (st["total_steps"], st["refunded_steps"]) == (1, 0)
    assert await gw.metric("gateway_idempotent_replays_total", endpoint=endpoint) == 1
    route = body["model"]
    assert await gw.metric("gateway_requests_total", endpoint=endpoint, route=route, status="200") == 2


async def test_replayed_stream_is_read_by_the_sdk_like_the_first(gw: Gateway, upstream: FakeUpstream) -> None:
    raw = chat_body(stream=True)
    first = await post(gw, CHAT, raw)
    again = await post(gw, CHAT, raw, {"x-stainless-retry-count": "2"})
    assert again.headers[REPLAYED] == "true" and again.headers["content-type"].startswith("text/event-stream")
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in sse_json(again.content) if c["choices"]
    )
    assert text == DEFAULT_TEXT
    assert again.content == first.content and again.content.endswith(b"data: [DONE]\n\n")
    assert len(upstream.requests) == 1


async def test_same_idempotency_key_is_one_call_whatever_the_body(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.script(UP_PATH, [Reply.json(chat_completion("first")), Reply.json(chat_completion("second"))])
    a = await post(gw, CHAT, chat_body(text="one"), {"Idempotency-Key": "k1"})
    b = await post(gw, CHAT, chat_body(text="two"), {"Idempotency-Key": "k1"})  # another body, same key
    c = await post(gw, CHAT, chat_body(text="one"), {"Idempotency-Key": "k2"})  # same body, another key
    assert a.json()["choices"][0]["message"]["content"] == "first"
    assert b.content == a.content and b.headers[REPLAYED] == "true"
    assert c.json()["choices"][0]["message"]["content"] == "second" and REPLAYED not in c.headers
    assert len(upstream.requests) == 2
    steps = await gw.steps("s1")
    assert [(s.seq, s.messages[0]["content"]) for s in steps] == [(1, "one"), (2, "one")]
    assert (await status(gw))["total_steps"] == 2


async def test_idempotency_key_is_per_session(gw: Gateway, upstream: FakeUpstream) -> None:
    raw = chat_body()
    await post(gw, CHAT, raw, {"Idempotency-Key": "k"})
    other = await post(gw, "/v1/sessions/s2/chat/completions", raw, {"Idempotency-Key": "k"})
    assert other.status_code == 200 and REPLAYED not in other.headers
    assert len(upstream.requests) == 2
    assert (len(await gw.steps("s1")), len(await gw.steps("s2"))) == (1, 1)


@pytest.mark.parametrize("retry_header", [None, "0", "not-a-number"])
async def test_repeated_body_without_retry_header_is_a_new_call(
    gw: Gateway, upstream: FakeUpstream, retry_header: str | None
) -> None:
    raw = chat_body()
    headers = {} if retry_header is None else {"x-stainless-retry-count": retry_header}
    first = await post(gw, CHAT, raw, headers)
    second = await post(gw, CHAT, raw, headers)
    assert first.status_code == second.status_code == 200
    assert REPLAYED not in second.headers
    assert len(upstream.requests) == 2
    assert [s.seq for s in await gw.steps("s1")] == [1, 2]


async def test_retry_with_another_body_is_a_new_call(gw: Gateway, upstream: FakeUpstream) -> None:
    await post(gw, CHAT, chat_body(text="one"))
    r = await post(gw, CHAT, chat_body(text="two"), RETRY)
    assert r.status_code == 200 and REPLAYED not in r.headers
    assert len(upstream.requests) == 2 and len(await gw.steps("s1")) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_retry_while_the_call_is_in_flight_joins_it(
    gw: Gateway, upstream: FakeUpstream, stream: bool
) -> None:
    def slow(req: Any) -> Reply:
        reply = upstream.default_reply(req)
        reply.delay_headers_s = 0.5
        return reply

    upstream.script(UP_PATH, [slow])
    raw = chat_body(stream=stream)
    # joined while in flight: an Idempotency-Key always joins (a retry recognised by its body
    # joins only a call whose client left: test_retry_join.py)
    key = {"Idempotency-Key": "k-1"}
    first = asyncio.ensure_future(post(gw, CHAT, raw, key))
    await upstream.wait_for_requests(1)
    again = await post(gw, CHAT, raw, key)
    orig = await first
    assert orig.status_code == again.status_code == 200
    assert again.content == orig.content
    assert again.headers[REPLAYED] == "true" and REPLAYED not in orig.headers
    assert len(upstream.requests) == 1
    [step] = await gw.steps("s1")
    assert (step.status, step.is_stream) == ("ok", stream)
    assert await gw.metric("gateway_idempotent_replays_total", endpoint="chat.completions") == 1


async def test_several_retries_join_one_call(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.script(UP_PATH, [Reply.json(chat_completion("once"), delay_headers_s=0.3)])
    raw = chat_body()
    key = {"Idempotency-Key": "k-1"}
    first = asyncio.ensure_future(post(gw, CHAT, raw, key))
    await upstream.wait_for_requests(1)
    retries = await asyncio.gather(
        *(post(gw, CHAT, raw, {**key, "x-stainless-retry-count": str(n)}) for n in (1, 2, 3))
    )
    orig = await first
    assert [r.json()["choices"][0]["message"]["content"] for r in retries] == ["once"] * 3
    assert all(r.content == orig.content for r in retries)
    assert len(upstream.requests) == 1 and len(await gw.steps("s1")) == 1
    assert await gw.metric("gateway_idempotent_replays_total", endpoint="chat.completions") == 3


async def test_retry_of_a_failed_call_is_a_new_call(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=500)])
    raw = chat_body()
    first = await post(gw, CHAT, raw)
    assert first.status_code == 500
    again = await post(gw, CHAT, raw, RETRY)
    assert again.status_code == 200 and REPLAYED not in again.headers
    assert again.json()["choices"][0]["message"]["content"] == DEFAULT_TEXT
    assert len(upstream.requests) == 2
    steps = await gw.steps("s1")
    assert [(s.seq, s.status, s.status_code) for s in steps] == [(1, "error", 500), (2, "ok", 200)]
    # the successful retry is now the call a further retry gets
    third = await post(gw, CHAT, raw, {"x-stainless-retry-count": "2"})
    assert third.headers[REPLAYED] == "true" and third.content == again.content
    assert len(upstream.requests) == 2


async def test_joined_call_that_fails_makes_the_retry_a_new_call(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": NO_RETRY})
    upstream.script(UP_PATH, [Reply.json(BUSY, status=503, delay_headers_s=0.3)])
    raw = chat_body()
    first = asyncio.ensure_future(post(gw, CHAT, raw))
    await upstream.wait_for_requests(1)
    again = await post(gw, CHAT, raw, RETRY)
    assert (await first).status_code == 503
    assert again.status_code == 200 and REPLAYED not in again.headers
    assert len(upstream.requests) == 2
    assert [s.status_code for s in await gw.steps("s1")] == [503, 200]
    assert await gw.metric("gateway_idempotent_replays_total", endpoint="chat.completions") == 0


async def test_failed_responses_answer_is_not_replayed(gw: Gateway, upstream: FakeUpstream) -> None:
    failed = response_object(status="failed")
    upstream.script("/v1/responses", [Reply.json(failed)])
    raw = json.dumps({"model": "m", "input": "hi"}).encode()
    first = await post(gw, "/v1/sessions/s1/responses", raw)
    assert first.json()["status"] == "failed"
    again = await post(gw, "/v1/sessions/s1/responses", raw, RETRY)
    assert again.json()["status"] == "completed" and REPLAYED not in again.headers
    assert [s.status for s in await gw.steps("s1")] == ["error", "ok"]


async def test_broken_stream_is_not_replayed(gw: Gateway, upstream: FakeUpstream) -> None:
    events = default_responses_stream()
    upstream.script("/v1/responses", [Reply.sse(events[:4])])  # ends before response.completed
    raw = json.dumps({"model": "m", "input": "hi", "stream": True}).encode()
    first = await post(gw, "/v1/sessions/s1/responses", raw)
    assert b"event: response.completed" not in first.content
    again = await post(gw, "/v1/sessions/s1/responses", raw, RETRY)
    assert REPLAYED not in again.headers and again.content == b"".join(events)
    assert [s.status for s in await gw.steps("s1")] == ["truncated", "ok"]


async def test_retry_of_a_synthetic_stop_is_a_synthetic_stop_and_a_done_call_is_replayed_after_the_budget(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=1)
    done = await post(gw, CHAT, chat_body(text="one"))
    stopped = await post(gw, CHAT, chat_body(text="two"))
    assert stopped.headers["x-gateway-stop-reason"] == "max_steps"
    again = await post(gw, CHAT, chat_body(text="two"), RETRY)
    assert again.headers["x-gateway-stop-reason"] == "max_steps" and REPLAYED not in again.headers
    replayed = await post(gw, CHAT, chat_body(text="one"), RETRY)  # no budget needed for a replay
    assert replayed.headers[REPLAYED] == "true" and replayed.content == done.content
    assert len(upstream.requests) == 1 and len(await gw.steps("s1")) == 1


async def test_passthrough_calls_are_not_deduplicated(gw: Gateway, upstream: FakeUpstream) -> None:
    raw = chat_body()
    for headers in ({}, RETRY, {"Idempotency-Key": "k"}, {"Idempotency-Key": "k"}):
        r = await post(gw, "/v1/chat/completions", raw, headers)
        assert r.status_code == 200 and REPLAYED not in r.headers
    assert len(upstream.requests) == 4


async def test_answer_over_the_cap_is_not_replayed(gw: Gateway, upstream: FakeUpstream) -> None:
    gw.app_state.sessions.recent_calls.max_entry_bytes = 100  # the default answer is ~250 bytes
    raw = chat_body()
    await post(gw, CHAT, raw)
    again = await post(gw, CHAT, raw, RETRY)
    assert again.status_code == 200 and REPLAYED not in again.headers
    assert len(upstream.requests) == 2 and len(await gw.steps("s1")) == 2


async def test_close_forgets_the_session_calls(gw: Gateway, upstream: FakeUpstream) -> None:
    raw = chat_body()
    await post(gw, CHAT, raw)
    assert len(gw.app_state.sessions.recent_calls) == 1
    r = await gw.http().post("/v1/sessions/s1/close", json={"reason": "done"})
    assert r.status_code == 200
    assert len(gw.app_state.sessions.recent_calls) == 0
    again = await post(gw, CHAT, raw, RETRY)
    assert again.status_code == 409 and REPLAYED not in again.headers
    assert len(upstream.requests) == 1


async def test_retry_after_a_restart_is_a_new_call(
    start_gateway: StartGateway, upstream: FakeUpstream, db_url: str
) -> None:
    gw = await start_gateway()
    raw = chat_body()
    await post(gw, CHAT, raw)
    await gw.stop()
    gw2 = await start_gateway(db_url=db_url)
    again = await post(gw2, CHAT, raw, RETRY)
    assert again.status_code == 200 and REPLAYED not in again.headers
    assert [s.seq for s in await gw2.steps("s1")] == [1, 2]


# ----------------------------------------------------------------------------- the table alone
def _replay(n: int) -> Replay:
    return Replay(200, {}, b"x" * n, "application/json")


async def test_call_key() -> None:
    body = b'{"model":"m"}'
    key, retry = call_key({"x-stainless-retry-count": "3"}, "chat.completions", body)
    assert retry is True and key[:2] == ("body", "chat.completions") and len(key[2]) == 32
    assert call_key({}, "chat.completions", body) == (key, False)
    assert call_key({}, "responses", body)[0] != key
    k1, r1 = call_key({"idempotency-key": "abc"}, "chat.completions", body)
    assert r1 is True and k1[0] == "key"
    assert call_key({"idempotency-key": "abc"}, "chat.completions", b"other")[0] == k1


async def test_recent_calls_lru_caps() -> None:
    t = RecentCalls(per_session=2, max_entries=3, max_entry_bytes=10, max_total_bytes=15)
    keys = [("body", "e", str(i)) for i in range(4)]
    a, b = t.begin("s1", keys[0]), t.begin("s1", keys[1])
    a.done(_replay(5))
    assert t.find("s1", keys[0]) is a and a.replay is not None
    c = t.begin("s1", keys[2])  # per-session cap 2: the least recently used (b) goes
    assert t.find("s1", keys[1]) is None and len(t) == 2
    b.done(_replay(5))
    assert b.replay is not None and t.bytes_held == 5  # not counted: no longer in the table
    d, e = t.begin("s2", keys[0]), t.begin("s3", keys[0])  # global cap 3: s1's oldest (a) goes
    assert len(t) == 3 and t.find("s1", keys[0]) is None and t.bytes_held == 0
    c.done(_replay(10))
    d.done(_replay(10))  # 20 bytes > 15: the least recently used (c) goes
    assert t.find("s1", keys[2]) is None and t.bytes_held == 10
    e.done(_replay(11))  # over the per-call cap: forgotten, a failure
    assert e.replay is None and await e.wait() is None and t.find("s3", keys[0]) is None
    t.drop("s2")
    assert len(t) == 0 and t.bytes_held == 0


async def test_failed_call_is_forgotten_and_wakes_its_waiters() -> None:
    t = RecentCalls()
    key = ("body", "e", "k")
    p = t.begin("s1", key)
    waiter = asyncio.ensure_future(p.wait())
    await asyncio.sleep(0)
    p.fail()
    assert await waiter is None and t.find("s1", key) is None
    p.done(_replay(1))  # settled already: no-op
    assert p.replay is None
